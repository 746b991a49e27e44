"""The ``specviz`` command (:func:`specviz.cli.main.main`): one module per command group, options checked
before any model loads."""
