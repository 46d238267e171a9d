from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Lease(_message.Message):
    __slots__ = ("ID", "TTL", "RemainingTTL")
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    REMAININGTTL_FIELD_NUMBER: _ClassVar[int]
    ID: int
    TTL: int
    RemainingTTL: int
    def __init__(self, ID: _Optional[int] = ..., TTL: _Optional[int] = ..., RemainingTTL: _Optional[int] = ...) -> None: ...
