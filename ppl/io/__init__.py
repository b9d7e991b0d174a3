"""Run folders on disk: the layout, schema and serialisation of a saved run and its identity
(:mod:`ppl.io.store`), loading one back (:mod:`ppl.io.load`), and the verdict a loaded run decides
again from its own records (:mod:`ppl.io.verdict`). What is read is untrusted: loading never
imports or calls anything a file names, and never takes a stored verdict on trust.
"""
