"""SGLang-facing glue for Layer 2: the hook on SGLang's op dispatch, the per-op bridges from
SGLang's forward signatures to the standard op signatures, and the dispatch log.

The op implementations themselves live in ``sglang_fl.dispatch`` and know nothing of SGLang.
Everything that depends on the SGLang version (hook targets, class paths, private names,
signature differences) is in that version's adapter, ``adapters``.
"""
