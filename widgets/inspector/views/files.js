// Files: save the session as a snapshot, load one back, and save the event stream as JSON Lines (the
// recording `specviz replay` / `specviz diagnose` read). Files travel in base64 parts, both ways, so a
// large snapshot never exceeds a host's message size. An upload sends one part at a time: Python answers
// each with an "upload" message naming the part to send next (after retry_ms when its gate asks the page
// to slow down), so a large snapshot goes at the pace the server allows instead of being refused.

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

/**
 * What to do with an "upload" answer for the uploads in `pending` (a Map id → {parts, name}): `{send: part
 * message, delay: ms}`, `{done: name}` (every part arrived; Python restores), `{error, name}` (refused, over)
 * or `{}` (not one of ours). Finished and refused uploads leave `pending`.
 */
export function nextUploadStep(pending, msg) {
  const u = pending.get(msg.id);
  if (!u || !Number.isInteger(msg.next)) return {};
  if (typeof msg.error === "string") {
    pending.delete(msg.id);
    return { error: msg.error, name: u.name };
  }
  if (msg.next >= u.parts.length) {
    pending.delete(msg.id);
    return { done: u.name };
  }
  return { send: u.parts[msg.next], delay: Number.isInteger(msg.retry_ms) ? msg.retry_ms : 0 };
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

/** `{el, download(msg), uploaded(msg), sync(config)}`: the buttons (for the toolbar) and the handlers of
 * "download" and "upload" messages. */
export function filesView(send, notices) {
  const pending = new Map();
  const uploading = new Map();
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
    const id = "u" + Date.now().toString(36);
    const parts = restoreMessages(id, bytes);
    uploading.set(id, { parts, name: f.name });
    send(parts[0]); // the rest follow as Python acknowledges each part
    notices.show("info", "sending " + f.name + " (" + bytes.length + " bytes) to restore");
  });

  function uploaded(msg) {
    const step = nextUploadStep(uploading, msg);
    if (step.error) notices.show("error", "the upload of " + step.name + " stopped: " + step.error);
    else if (step.done) notices.show("info", "sent " + step.done + "; restoring");
    else if (step.send && step.delay) setTimeout(() => send(step.send), step.delay);
    else if (step.send) send(step.send);
    el.dataset.uploading = String(uploading.size);
  }

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
    btnSnap.disabled = !live || !!config.running || !!config.working || !config.strategy;
    btnLoad.disabled = !live || !!config.running || !!config.working;
    btnRec.disabled = false;
  }

  return { el, download, uploaded, sync };
}
