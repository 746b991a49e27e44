// The page's side of the message protocol, as pure functions of the state (no DOM, no host).
//
// Python owns the session; the front-end only renders the event stream it is sent. Every message, both
// ways, is declared once in widgets/protocol.json (with its fields); messages.js builds those the page
// sends, index.js has one handler per message it is sent, and the node tests check both against the
// declaration (widgets/tests/declaration.test.js).
// A rewind arrives as a "rewound" event in the stream: the reducer drops the later rounds itself.
// A view applies an "events" message only when start == the number of events it holds; a gap
// (a message it missed) makes it ask again with hello, so Python never resends what a view has.
// Python checks every message a view sends; a message it refuses changes nothing and comes back as
// a "notice" of level "error" (or, for the knob form, as "knob_errors" beside the fields).

/**
 * What to do with an "events" message given the state: `{error}` for a malformed message, `{ask: true}`
 * when events are missing (a gap, or a new epoch that does not start at 0: send hello again), otherwise
 * `{reset, events}`: start from an empty state of the message's epoch when `reset`, then apply `events`
 * (the ones the state does not hold yet; possibly none).
 */
export function planEvents(state, msg) {
  if (!Number.isInteger(msg.epoch) || !Number.isInteger(msg.start) || msg.start < 0 || !Array.isArray(msg.events)) {
    return { error: "ignored a malformed events message (epoch, start or events missing or of the wrong type)" };
  }
  let have = state.n;
  let reset = false;
  if (msg.epoch !== state.epoch) {
    if (msg.start !== 0) return { ask: true };
    reset = true;
    have = 0;
  }
  if (msg.start > have) return { ask: true };
  return { ask: false, reset, events: msg.events.slice(have - msg.start) };
}

/** The messages inside a "packed" message, in order: `{messages}`, or `{error}` when it is malformed. */
export function unpackMessages(msg) {
  let list;
  try {
    list = typeof msg.json === "string" ? JSON.parse(msg.json) : null;
  } catch (e) {
    list = null;
  }
  if (!Array.isArray(list)) return { error: "ignored a malformed packed message (json is not a list of messages)" };
  return { messages: list.filter((m) => m && typeof m === "object" && m.type !== "packed") };
}

/** True when a "state" message is older than the newest one applied (`lastSeq`, -1 for none): the host may
 * deliver a message it had to queue after a later one. A state without a seq (an older server) is never stale. */
export function stateIsStale(lastSeq, msg) {
  return typeof msg.seq === "number" && msg.seq < lastSeq;
}
