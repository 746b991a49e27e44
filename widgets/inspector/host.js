// The host adapter: anywidget (JupyterLab) and Panel's JSComponent hand render() different models.
//
// anywidget:  model.send(msg) / model.on("msg:custom", cb) / model.off("msg:custom", cb)
// Panel:      model.send_msg(msg) / model.on("msg:custom", cb) (off is missing in older Panel versions)

/** `{kind, send(msg), on(cb), off(cb)}` for the model a host passed to render. */
export function hostOf(model) {
  if (typeof model.send_msg === "function") {
    return {
      kind: "panel",
      send: (m) => model.send_msg(m),
      on: (cb) => model.on("msg:custom", cb),
      off: (cb) => {
        try {
          model.off("msg:custom", cb);
        } catch (e) {
          /* older hosts */
        }
      },
    };
  }
  return {
    kind: "anywidget",
    send: (m) => model.send(m),
    on: (cb) => model.on("msg:custom", cb),
    off: (cb) => model.off("msg:custom", cb),
  };
}
