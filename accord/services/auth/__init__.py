"""etcd-compatible authentication and role-based access control.

Pure model (``perms``, ``store``), the token providers (``tokens``), the replicated
state machine of the meta group (``statemachine``), the enforcement point every
servicer calls (``guard``) and the ``etcdserverpb.Auth`` servicer (``servicer``).
``docs/security.md`` explains the choices.
"""
