"""The streaming path: faust agents that carry posts from `posts` to `decisions`.

Read in this order: `topics.py` (what flows where), `app.py` (the faust app), `agents.py` (the
wiring), `scoring.py` (batch -> Triton -> probabilities), `verdict.py` (probabilities -> decision).
"""
