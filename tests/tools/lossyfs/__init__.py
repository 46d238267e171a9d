"""lossyfs: a FUSE file system that forgets, at a power cut, what was not synced.

It passes every operation through to a backing directory but keeps, in a volatile
layer, every byte written since the file's last ``fsync``/``fdatasync`` and every
create, rename, link and unlink since the directory's last ``fsync``. A power cut
throws that layer away (optionally keeping a seeded random prefix of each file's
unsynced writes, torn at any byte); the mount then shows what a machine finds after
it lost power and rebooted. ``kill -9`` alone leaves the page cache intact, so it
never shows a missing fsync; this does.

* ``layer`` - the volatile layer and the cut (pure file operations, no FUSE);
* ``ops`` - the FUSE operations (mfusepy) over the layer;
* ``__main__`` - the process: the FUSE loop and a control connection;
* ``control`` - the test's handle (``LossyFS``: start, ``power_cut``, status, stop).

The rules, and what accord syncs when, are in ``docs/durability.md``.
"""
