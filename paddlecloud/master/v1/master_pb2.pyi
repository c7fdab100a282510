import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_RESULT_UNSPECIFIED: _ClassVar[ReportResult]
    ACCEPTED: _ClassVar[ReportResult]
    STALE: _ClassVar[ReportResult]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    TASK: _ClassVar[Outcome]
    WAIT: _ClassVar[Outcome]
    EPOCH_DONE: _ClassVar[Outcome]
    JOB_DONE: _ClassVar[Outcome]
    ALL_TASKS_FAILED: _ClassVar[Outcome]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TODO: _ClassVar[TaskState]
    PENDING: _ClassVar[TaskState]
    DONE: _ClassVar[TaskState]
    FAILED: _ClassVar[TaskState]

class SplitAnswer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_ANSWER_UNSPECIFIED: _ClassVar[SplitAnswer]
    STOP: _ClassVar[SplitAnswer]
    CONTINUE: _ClassVar[SplitAnswer]
    NOT_HELD: _ClassVar[SplitAnswer]
REPORT_RESULT_UNSPECIFIED: ReportResult
ACCEPTED: ReportResult
STALE: ReportResult
OUTCOME_UNSPECIFIED: Outcome
TASK: Outcome
WAIT: Outcome
EPOCH_DONE: Outcome
JOB_DONE: Outcome
ALL_TASKS_FAILED: Outcome
TASK_STATE_UNSPECIFIED: TaskState
TODO: TaskState
PENDING: TaskState
DONE: TaskState
FAILED: TaskState
SPLIT_ANSWER_UNSPECIFIED: SplitAnswer
STOP: SplitAnswer
CONTINUE: SplitAnswer
NOT_HELD: SplitAnswer

class DatasetSpec(_message.Message):
    __slots__ = ("paths", "format", "chunk_bytes", "chunks_per_task", "num_epochs", "shuffle_seed")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    format: str
    chunk_bytes: int
    chunks_per_task: int
    num_epochs: int
    shuffle_seed: int
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., format: _Optional[str] = ..., chunk_bytes: _Optional[int] = ..., chunks_per_task: _Optional[int] = ..., num_epochs: _Optional[int] = ..., shuffle_seed: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("path", "begin", "end")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    path: str
    begin: int
    end: int
    def __init__(self, path: _Optional[str] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "epoch", "attempt", "chunks", "format")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    id: int
    epoch: int
    attempt: int
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    format: str
    def __init__(self, id: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., format: _Optional[str] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("task_id", "epoch", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    epoch: int
    attempt: int
    def __init__(self, task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class RegisterTrainerRequest(_message.Message):
    __slots__ = ("trainer_id",)
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    trainer_id: str
    def __init__(self, trainer_id: _Optional[str] = ...) -> None: ...

class RegisterTrainerResponse(_message.Message):
    __slots__ = ("session_id", "ttl", "current_epoch", "num_epochs", "session_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    ttl: _duration_pb2.Duration
    current_epoch: int
    num_epochs: int
    session_token: str
    def __init__(self, session_id: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., current_epoch: _Optional[int] = ..., num_epochs: _Optional[int] = ..., session_token: _Optional[str] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("ttl", "split_requests")
    TTL_FIELD_NUMBER: _ClassVar[int]
    SPLIT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ttl: _duration_pb2.Duration
    split_requests: _containers.RepeatedCompositeFieldContainer[TaskRef]
    def __init__(self, ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., split_requests: _Optional[_Iterable[_Union[TaskRef, _Mapping]]] = ...) -> None: ...

class LeaveTrainerRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class LeaveTrainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TaskReport(_message.Message):
    __slots__ = ("session_id", "task_id", "epoch", "attempt", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    task_id: int
    epoch: int
    attempt: int
    reason: str
    def __init__(self, session_id: _Optional[int] = ..., task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskReportResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ReportResult
    def __init__(self, result: _Optional[_Union[ReportResult, str]] = ...) -> None: ...

class SetDatasetRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: DatasetSpec
    def __init__(self, dataset: _Optional[_Union[DatasetSpec, _Mapping]] = ...) -> None: ...

class SetDatasetResponse(_message.Message):
    __slots__ = ("num_tasks",)
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    num_tasks: int
    def __init__(self, num_tasks: _Optional[int] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "finished", "max_tasks")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    epoch: int
    finished: _containers.RepeatedCompositeFieldContainer[TaskRef]
    max_tasks: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., finished: _Optional[_Iterable[_Union[TaskRef, _Mapping]]] = ..., max_tasks: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("outcome", "task", "current_epoch", "retry_after", "finished_results", "more_tasks", "split_poll")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    FINISHED_RESULTS_FIELD_NUMBER: _ClassVar[int]
    MORE_TASKS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_POLL_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    task: Task
    current_epoch: int
    retry_after: _duration_pb2.Duration
    finished_results: _containers.RepeatedScalarFieldContainer[ReportResult]
    more_tasks: _containers.RepeatedCompositeFieldContainer[Task]
    split_poll: _duration_pb2.Duration
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., current_epoch: _Optional[int] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., finished_results: _Optional[_Iterable[_Union[ReportResult, str]]] = ..., more_tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., split_poll: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RestartEpochRequest(_message.Message):
    __slots__ = ("epoch", "done_tasks", "reopen")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DONE_TASKS_FIELD_NUMBER: _ClassVar[int]
    REOPEN_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    done_tasks: _containers.RepeatedScalarFieldContainer[int]
    reopen: bool
    def __init__(self, epoch: _Optional[int] = ..., done_tasks: _Optional[_Iterable[int]] = ..., reopen: _Optional[bool] = ...) -> None: ...

class RestartEpochResponse(_message.Message):
    __slots__ = ("current_epoch",)
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    current_epoch: int
    def __init__(self, current_epoch: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TaskCounts(_message.Message):
    __slots__ = ("todo", "pending", "done", "failed")
    TODO_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    todo: int
    pending: int
    done: int
    failed: int
    def __init__(self, todo: _Optional[int] = ..., pending: _Optional[int] = ..., done: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("job", "namespace", "phase", "leader", "current_epoch", "num_epochs", "counts", "num_tasks", "trainers_alive", "pserver_endpoints", "has_dataset", "requeued", "min_trainers", "max_trainers", "desired_trainers", "trainer_seconds", "tasks_assigned", "splits_this_epoch", "splits")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    TRAINERS_ALIVE_FIELD_NUMBER: _ClassVar[int]
    PSERVER_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    HAS_DATASET_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    MIN_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    MAX_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TASKS_ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    SPLITS_THIS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    job: str
    namespace: str
    phase: str
    leader: str
    current_epoch: int
    num_epochs: int
    counts: TaskCounts
    num_tasks: int
    trainers_alive: int
    pserver_endpoints: _containers.RepeatedScalarFieldContainer[str]
    has_dataset: bool
    requeued: int
    min_trainers: int
    max_trainers: int
    desired_trainers: int
    trainer_seconds: _containers.RepeatedCompositeFieldContainer[TrainerSeconds]
    tasks_assigned: bool
    splits_this_epoch: int
    splits: int
    def __init__(self, job: _Optional[str] = ..., namespace: _Optional[str] = ..., phase: _Optional[str] = ..., leader: _Optional[str] = ..., current_epoch: _Optional[int] = ..., num_epochs: _Optional[int] = ..., counts: _Optional[_Union[TaskCounts, _Mapping]] = ..., num_tasks: _Optional[int] = ..., trainers_alive: _Optional[int] = ..., pserver_endpoints: _Optional[_Iterable[str]] = ..., has_dataset: _Optional[bool] = ..., requeued: _Optional[int] = ..., min_trainers: _Optional[int] = ..., max_trainers: _Optional[int] = ..., desired_trainers: _Optional[int] = ..., trainer_seconds: _Optional[_Iterable[_Union[TrainerSeconds, _Mapping]]] = ..., tasks_assigned: _Optional[bool] = ..., splits_this_epoch: _Optional[int] = ..., splits: _Optional[int] = ...) -> None: ...

class TrainerSeconds(_message.Message):
    __slots__ = ("cause", "seconds")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    cause: str
    seconds: float
    def __init__(self, cause: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("id", "state", "epoch", "holder", "session_id", "attempt", "failures", "chunks")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    id: int
    state: TaskState
    epoch: int
    holder: str
    session_id: int
    attempt: int
    failures: int
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    def __init__(self, id: _Optional[int] = ..., state: _Optional[_Union[TaskState, str]] = ..., epoch: _Optional[int] = ..., holder: _Optional[str] = ..., session_id: _Optional[int] = ..., attempt: _Optional[int] = ..., failures: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("state", "epoch", "page_size", "page_token")
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    epoch: int
    page_size: int
    page_token: str
    def __init__(self, state: _Optional[_Union[TaskState, str]] = ..., epoch: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class TrainerInfo(_message.Message):
    __slots__ = ("trainer_id", "session_id", "tasks_held", "since_last_call")
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_HELD_FIELD_NUMBER: _ClassVar[int]
    SINCE_LAST_CALL_FIELD_NUMBER: _ClassVar[int]
    trainer_id: str
    session_id: int
    tasks_held: _containers.RepeatedScalarFieldContainer[int]
    since_last_call: _duration_pb2.Duration
    def __init__(self, trainer_id: _Optional[str] = ..., session_id: _Optional[int] = ..., tasks_held: _Optional[_Iterable[int]] = ..., since_last_call: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ListTrainersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTrainersResponse(_message.Message):
    __slots__ = ("trainers", "next_page_token")
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    trainers: _containers.RepeatedCompositeFieldContainer[TrainerInfo]
    next_page_token: str
    def __init__(self, trainers: _Optional[_Iterable[_Union[TrainerInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RequestSaveModelRequest(_message.Message):
    __slots__ = ("session_id", "block")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    block: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[int] = ..., block: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RequestSaveModelResponse(_message.Message):
    __slots__ = ("granted",)
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    def __init__(self, granted: _Optional[bool] = ...) -> None: ...

class ScaleTrainersRequest(_message.Message):
    __slots__ = ("trainers",)
    TRAINERS_FIELD_NUMBER: _ClassVar[int]
    trainers: int
    def __init__(self, trainers: _Optional[int] = ...) -> None: ...

class ScaleTrainersResponse(_message.Message):
    __slots__ = ("min_trainers", "max_trainers", "desired_trainers")
    MIN_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    MAX_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    min_trainers: int
    max_trainers: int
    desired_trainers: int
    def __init__(self, min_trainers: _Optional[int] = ..., max_trainers: _Optional[int] = ..., desired_trainers: _Optional[int] = ...) -> None: ...

class SplitTaskRequest(_message.Message):
    __slots__ = ("session_id", "task_id", "epoch", "attempt", "position")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    task_id: int
    epoch: int
    attempt: int
    position: int
    def __init__(self, session_id: _Optional[int] = ..., task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class SplitTaskResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: SplitAnswer
    def __init__(self, answer: _Optional[_Union[SplitAnswer, str]] = ...) -> None: ...

class EvictTrainerRequest(_message.Message):
    __slots__ = ("trainer_id",)
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    trainer_id: str
    def __init__(self, trainer_id: _Optional[str] = ...) -> None: ...

class EvictTrainerResponse(_message.Message):
    __slots__ = ("session_id", "tasks_returned")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_RETURNED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    tasks_returned: int
    def __init__(self, session_id: _Optional[int] = ..., tasks_returned: _Optional[int] = ...) -> None: ...
