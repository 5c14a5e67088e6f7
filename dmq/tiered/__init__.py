"""Tiered storage: an object store for closed segments and the reads that come back from it.

store.py: the object-store interface and its file:// backend; cache.py: the bounded chunk
cache of remote byte ranges; remote_read.py: whole batches of a remote segment by byte
range. The manifest (what was uploaded) is the partition's replicated state
(dmq/partition/remote_manifest.py); the upload and retention duties are the broker's
(dmq/broker/tiered.py). See README.md here.
"""
