"""Users, roles and their permissions, with etcd's rules: the pure auth store.

Deterministic and free of I/O: the meta group's state machine (``statemachine.py``)
applies the same commands on every member, so every member holds the same store at the
same log index. Passwords arrive here already hashed (bcrypt, done by the member that
took the request), so neither the log nor a snapshot holds a password.

etcd's rules kept here (measured against etcd 3.4.23):

* the revision starts at 1 and every change of a user or role adds one; enabling,
  disabling and an ignored grant (role already granted) do not;
* auth can be enabled only when a user ``root`` exists and holds the role ``root``
  (the role need not exist as a role: granting ``root`` never fails for that);
* while auth is on, the user ``root`` cannot be deleted, the role ``root`` cannot be
  deleted, and ``root`` cannot lose the role ``root``: root is never locked out;
* a user holding the role ``root`` may do everything; any other user may do what the
  union of its roles' permissions covers (``perms.py``);
* deleting a role takes it away from every user; granting a permission already granted
  for the same key and range end replaces its kind.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from accord.services.auth import errors
from accord.services.auth.perms import Permission, PermissionSet, PermType

ROOT = "root"


@dataclass(slots=True)
class User:
    """A user: its bcrypt hash (empty for a ``--no-password`` user) and its roles."""

    name: str
    password_hash: bytes
    roles: list[str] = field(default_factory=list)
    no_password: bool = False


@dataclass(slots=True)
class Role:
    """A role: its permissions, sorted by (key, range_end) as etcd lists them."""

    name: str
    perms: list[Permission] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class UserRights:
    """What one user may read and write (merged), or everything (root)."""

    root: bool
    read: PermissionSet
    write: PermissionSet

    def allows(self, key: bytes, range_end: bytes, need: PermType) -> bool:
        """Whether the request ``(key, range_end)`` of kind ``need`` is permitted."""
        if self.root:
            return True
        return (self.read if need == PermType.READ else self.write).covers(key, range_end)


class AuthStore:
    """The replicated auth state: users, roles, whether auth is on, the revision."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.roles: dict[str, Role] = {}
        self.enabled = False
        self.revision = 1
        self._rights: dict[str, UserRights] = {}

    # --- reads --------------------------------------------------------------------------
    def user(self, name: str) -> User:
        """The user ``name`` or etcd's ``user name not found``."""
        user = self.users.get(name)
        if user is None:
            raise errors.USER_NOT_FOUND
        return user

    def role(self, name: str) -> Role:
        """The role ``name`` or etcd's ``role name not found``."""
        role = self.roles.get(name)
        if role is None:
            raise errors.ROLE_NOT_FOUND
        return role

    def user_names(self) -> list[str]:
        """Every user, sorted."""
        return sorted(self.users)

    def role_names(self) -> list[str]:
        """Every role, sorted."""
        return sorted(self.roles)

    def rights(self, name: str) -> UserRights | None:
        """What ``name`` may do (cached until the store changes); ``None``: no such user."""
        cached = self._rights.get(name)
        if cached is not None:
            return cached
        user = self.users.get(name)
        if user is None:
            return None
        perms = [p for r in user.roles if (role := self.roles.get(r)) for p in role.perms]
        rights = UserRights(ROOT in user.roles, PermissionSet.of(perms, PermType.READ),
                            PermissionSet.of(perms, PermType.WRITE))
        self._rights[name] = rights
        return rights

    def is_root(self, name: str) -> bool:
        """Whether ``name`` exists and holds the role root."""
        user = self.users.get(name)
        return user is not None and ROOT in user.roles

    # --- changes (each raises the etcd error and changes nothing, or changes and bumps) ---
    def _changed(self) -> None:
        self.revision += 1
        self._rights.clear()

    def enable(self) -> None:
        """Turn auth on (needs root holding the root role); on already: nothing."""
        if self.enabled:
            return
        root = self.users.get(ROOT)
        if root is None:
            raise errors.ROOT_USER_MISSING
        if ROOT not in root.roles:
            raise errors.ROOT_ROLE_MISSING
        self.enabled = True
        self._rights.clear()

    def disable(self) -> None:
        """Turn auth off."""
        self.enabled = False
        self._rights.clear()

    def user_add(self, name: str, password_hash: bytes, no_password: bool = False) -> None:
        """Add a user (``password_hash`` already bcrypt)."""
        if not name:
            raise errors.USER_EMPTY
        if name in self.users:
            raise errors.USER_EXISTS
        self.users[name] = User(name, password_hash, [], no_password)
        self._changed()

    def user_delete(self, name: str) -> None:
        """Delete a user (never root while auth is on)."""
        if self.enabled and name == ROOT:
            raise errors.INVALID_AUTH_MGMT
        self.user(name)
        del self.users[name]
        self._changed()

    def user_change_password(self, name: str, password_hash: bytes) -> None:
        """Replace a user's password hash."""
        user = self.user(name)
        user.password_hash = password_hash
        user.no_password = False
        self._changed()

    def user_grant_role(self, name: str, role: str) -> None:
        """Give ``role`` to ``name`` (already held: nothing; ``root`` needs no role entry)."""
        user = self.user(name)
        if role != ROOT:
            self.role(role)
        i = bisect.bisect_left(user.roles, role)
        if i < len(user.roles) and user.roles[i] == role:
            return
        user.roles.insert(i, role)
        self._changed()

    def user_revoke_role(self, name: str, role: str) -> None:
        """Take ``role`` from ``name`` (never root's root while auth is on)."""
        if self.enabled and name == ROOT and role == ROOT:
            raise errors.INVALID_AUTH_MGMT
        user = self.user(name)
        if role not in user.roles:
            raise errors.ROLE_NOT_GRANTED
        user.roles.remove(role)
        self._changed()

    def role_add(self, name: str) -> None:
        """Add an empty role."""
        if not name:
            raise errors.ROLE_EMPTY
        if name in self.roles:
            raise errors.ROLE_EXISTS
        self.roles[name] = Role(name)
        self._changed()

    def role_delete(self, name: str) -> None:
        """Delete a role (never root while auth is on) and take it from every user."""
        if self.enabled and name == ROOT:
            raise errors.INVALID_AUTH_MGMT
        self.role(name)
        del self.roles[name]
        for user in self.users.values():
            if name in user.roles:
                user.roles.remove(name)
        self._changed()

    def role_grant_permission(self, name: str, perm: Permission) -> None:
        """Grant ``perm`` to a role (same key and range end: its kind is replaced)."""
        role = self.role(name)
        at = (perm.key, perm.range_end)
        keys = [(p.key, p.range_end) for p in role.perms]
        i = bisect.bisect_left(keys, at)
        if i < len(keys) and keys[i] == at:
            role.perms[i] = perm
        else:
            role.perms.insert(i, perm)
        self._changed()

    def role_revoke_permission(self, name: str, key: bytes, range_end: bytes) -> None:
        """Take the permission on exactly ``(key, range_end)`` from a role."""
        role = self.role(name)
        for i, p in enumerate(role.perms):
            if p.key == key and p.range_end == range_end:
                del role.perms[i]
                self._changed()
                return
        raise errors.PERMISSION_NOT_GRANTED

    # --- images (snapshots) ---------------------------------------------------------------
    def image(self) -> dict[str, object]:
        """Everything, as plain msgpack-able values."""
        return {
            "enabled": self.enabled,
            "revision": self.revision,
            "users": [[u.name, u.password_hash, list(u.roles), u.no_password]
                      for u in sorted(self.users.values(), key=lambda u: u.name)],
            "roles": [[r.name, [[int(p.perm_type), p.key, p.range_end] for p in r.perms]]
                      for r in sorted(self.roles.values(), key=lambda r: r.name)],
        }

    @classmethod
    def from_image(cls, image: dict[str, object]) -> AuthStore:
        """The store an :meth:`image` describes."""
        store = cls()
        store.enabled = bool(image["enabled"])
        store.revision = int(image["revision"])  # type: ignore[call-overload]
        for name, phash, roles, no_pw in image["users"]:  # type: ignore[attr-defined]
            store.users[name] = User(name, bytes(phash), sorted(roles), bool(no_pw))
        for name, perms in image["roles"]:  # type: ignore[attr-defined]
            store.roles[name] = Role(name, [Permission(PermType(t), bytes(k), bytes(e))
                                            for t, k, e in perms])
        return store
