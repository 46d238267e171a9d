from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReadLogRequest(_message.Message):
    __slots__ = ("job_id", "rank", "attempt", "stream", "offset", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    stream: str
    offset: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data", "offset", "attempt")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    attempt: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...
