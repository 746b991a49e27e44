// specviz's compatibility layer for building llama.cpp's Vulkan backend against older Vulkan headers.
//
// Why: the vendored llama.cpp (llama-cpp-python 0.3.36) creates its Vulkan instance with a
// VkLayerSettingsCreateInfoEXT in the pNext chain, unconditionally. That extension (VK_EXT_layer_settings)
// entered the Vulkan headers after 1.3.239, the version Debian 12 ships in libvulkan-dev, so
// ggml-vulkan.cpp does not compile there ("'LayerSettingEXT' is not a member of 'vk'"). Everything else
// newer that ggml-vulkan uses is guarded by feature macros upstream; this one struct is not.
//
// How: tools/llama_cmake_args.py puts this folder first on the C++ include path of the Vulkan build
// (-DCMAKE_CXX_FLAGS=-I...). This file then stands in for <vulkan/vulkan.hpp>: it includes the real
// header (#include_next) and, only when that header lacks the extension, declares the three names
// ggml-vulkan.cpp uses with the layout the Vulkan specification gives them. With headers that have the
// extension it adds nothing. Nothing of llama.cpp's source is changed.
//
// Effect at run time: none that matters. The structure is chained into VkInstanceCreateInfo with its
// registered structure type; without the validation layer (ggml enables it only when the layer is
// installed) the loader and the driver skip structures they do not consume.
#pragma once

#include_next <vulkan/vulkan.hpp>

#ifndef VK_EXT_layer_settings
#include <cstdint>
#include <vector>

namespace VULKAN_HPP_NAMESPACE {

// VkLayerSettingTypeEXT
enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0,
    eInt32 = 1,
    eInt64 = 2,
    eUint32 = 3,
    eUint64 = 4,
    eFloat32 = 5,
    eFloat64 = 6,
    eString = 7,
};

// VkLayerSettingEXT
struct LayerSettingEXT {
    const char * pLayerName;
    const char * pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void * pValues;
};

// VkLayerSettingsCreateInfoEXT (sType VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT = 1000496000)
struct LayerSettingsCreateInfoEXT {
    VkStructureType sType = static_cast<VkStructureType>(1000496000);
    const void * pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT * pSettings = nullptr;

    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};

}  // namespace VULKAN_HPP_NAMESPACE
#endif
