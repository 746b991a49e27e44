"""The decoding core: the :class:`~specviz.decoding.session.Session` facade and the pure parts of a round.

One module per concept: the round (:mod:`.round`), its events (:mod:`.round_events`, :mod:`.events`), the
acceptor (:mod:`.acceptor`, :mod:`.rowscan`, :mod:`.sampling`), the draft-length budget and the drafting
policies (:mod:`.budget`, :mod:`.policy`), telemetry counters (:mod:`.telemetry`), the knob schema
(:mod:`.knob_schema`), a request's checks (:mod:`.request`, :mod:`.stops`, :mod:`.chat`), rewinds and
snapshots (:mod:`.rewind`, :mod:`.snapshot`) and recordings (:mod:`.recorder`). Nothing here imports a UI
library. Users import from :mod:`specviz`.
"""
