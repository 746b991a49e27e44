"""``specviz serve`` and ``specviz replay``: the Panel server (:mod:`.app`), its pages (:mod:`.pages`), managed
sessions and their pool (:mod:`.pool`), the round scheduler (:mod:`.scheduler`), the draft catalog
(:mod:`.catalog`), presenter mode (:mod:`.presenter`) and access control (:mod:`.access`)."""
