"""Fenced locks, lock-delay and leader elections on the KV API (see README.md here).

``recipe`` (locks) and ``election`` hold the algorithms, run over a ``store.LockStore``;
``servicer`` serves them as etcd's v3lock/v3election services; ``accord.client`` runs the
same recipes client-side.
"""
