// Files: save the session as a snapshot, load one back, and save the event stream as JSON Lines (the
// recording `specviz replay` / `specviz diagnose` read). Files travel in base64 parts, both ways, so a
// large snapshot never exceeds a host's message size.

import { h } from "../dom.js";
import { fileMessage, restoreMessages } from "../messages.js";

/**
 * Add one part of a download message to `pending` (a Map keyed by the download's id); returns
 * `{done: false}` or, with the last part, `{done: true, name, mime, parts}` (the base64 parts in order).
 */
export function collectPart(pending, msg) {
  if (typeof msg.id !== "string" || !Number.isInteger(msg.index) || !Number.isInteger(msg.count) || msg.count < 1 ||
    msg.index < 0 || msg.index >= msg.count || typeof msg.data !== "string") {
    return { done: false, error: "ignored a malformed download part" };
  }
  let entry = pending.get(msg.id);
  if (!entry) {
    entry = { name: msg.name, mime: msg.mime, parts: new Array(msg.count).fill(null), got: 0 };
    pending.set(msg.id, entry);
  }
  if (entry.parts[msg.index] == null) entry.got += 1;
  entry.parts[msg.index] = msg.data;
  if (entry.got < entry.parts.length) return { done: false };
  pending.delete(msg.id);
  return { done: true, name: entry.name, mime: entry.mime, parts: entry.parts };
}

function partsToBlob(parts, mime) {
  const chunks = parts.map((b64) => {
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  });
  return new Blob(chunks, { type: mime || "application/octet-stream" });
}

/** `{el, download(msg)}`: the buttons (for the toolbar) and the handler of "download" messages. */
export function filesView(send, notices) {
  const pending = new Map();
  const btnSnap = h("button", { class: "sv-btn sv-snapshot", title: "save the whole session (caches included) as a snapshot file" }, "⤓ Snapshot");
  const upload = h("input", { type: "file", class: "sv-upload", hidden: true });
  const btnLoad = h("button", { class: "sv-btn sv-restore", title: "load a snapshot file saved here (the same model)" }, "⤒ Load");
  const btnRec = h("button", { class: "sv-btn sv-record", title: "save every event as JSON Lines (specviz replay / diagnose / advise read it)" }, "⤓ JSONL");
  const el = h("span", { class: "sv-files" }, btnSnap, btnLoad, btnRec, upload);
  btnSnap.addEventListener("click", () => send(fileMessage("snapshot")));
  btnRec.addEventListener("click", () => send(fileMessage("record")));
  btnLoad.addEventListener("click", () => upload.click());
  upload.addEventListener("change", async () => {
    const f = upload.files && upload.files[0];
    upload.value = "";
    if (!f) return;
    const bytes = new Uint8Array(await f.arrayBuffer());
    for (const part of restoreMessages("u" + Date.now().toString(36), bytes)) send(part);
    notices.show("info", "sent " + f.name + " (" + bytes.length + " bytes) to restore");
  });

  // the last completed download stays reachable for tests and for browsers that block the click
  function download(msg) {
    const r = collectPart(pending, msg);
    if (r.error) notices.show("error", r.error);
    if (!r.done) return;
    const blob = partsToBlob(r.parts, r.mime);
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: r.name || "specviz-file", class: "sv-download-link", text: r.name });
    el.append(a);
    a.click();
    el.dataset.lastDownload = r.name + ":" + blob.size;
    setTimeout(() => {
      URL.revokeObjectURL(url);
      a.remove();
    }, 60000);
  }

  function sync(config) {
    const live = !config.replay && config.can_control;
    btnSnap.disabled = !live || !!config.running || !config.strategy;
    btnLoad.disabled = !live || !!config.running;
    btnRec.disabled = false;
  }

  return { el, download, sync };
}
