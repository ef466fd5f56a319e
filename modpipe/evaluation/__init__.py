"""Evaluation of a built text model on corpora that never feed a build.

Kept outside `modpipe.textmodel`: the build's cache key hashes every Python source of that package
(`modpipe.textmodel.build.source_hash`), and what only measures a build must not force a rebuild.
"""
