"""Analysis of sessions and recordings: why acceptance is low (:mod:`.diagnose`), the best draft settings
(:mod:`.advise`), two lanes side by side (:mod:`.compare`), plain vs speculative greedy
(:mod:`.equivalence`), the benchmark (:mod:`.bench`, on the prompts of :mod:`.workloads`) and llama.cpp's own
tools run for comparison (:mod:`.native`), and what a model (pair) can run: ``specviz info``
(:mod:`.model_info`)."""
