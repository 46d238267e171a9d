from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Member(_message.Message):
    __slots__ = ("name", "address", "state", "incarnation", "metadata", "state_age")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_AGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    state: str
    incarnation: int
    metadata: _containers.ScalarMap[str, str]
    state_age: float
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., incarnation: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., state_age: _Optional[float] = ...) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: str
    def __init__(self, role: _Optional[str] = ...) -> None: ...

class MembersResponse(_message.Message):
    __slots__ = ("self", "members")
    SELF_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    self: str
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self_, self: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: str
    def __init__(self, role: _Optional[str] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("kind", "member", "snapshot")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    member: Member
    snapshot: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, kind: _Optional[str] = ..., member: _Optional[_Union[Member, _Mapping]] = ..., snapshot: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...
