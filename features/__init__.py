"""Pure feature logic for the moderation pipeline: no Kafka, no stream runtime, no I/O.

Modules:
  url      parse/canonicalise link URLs, registrable domain (offline public-suffix list), URL signals
  brands   lookalike-of-a-brand-domain detection (homoglyph folding + edit distance)
  text     `text_fingerprint` for "same text" counting
  obfuscation  look-alike / invisible / letter-spaced / leetspeak shares of a text (UTS #39 confusables)
  journey  UI-journey features
  events   raw event -> normalised context dict, timestamps, IP/ban-key normalisation
  state    JSON-serialisable per-key table states, idempotent under re-delivery, bounded memory
  vector   FEATURE_NAMES, `assemble` (the decision record's features map), `to_numeric_vector`
  offline  reference one-pass computation over an ordered event list (same per-event code, dict storage)
"""
