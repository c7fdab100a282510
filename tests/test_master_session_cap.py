"""Sessions are capped per job by its trainer range: one holder of the shared trainer token
cannot open sessions under made-up ids and hold every task (docs: README, "Security").

The pure rule first, then a real master over real gRPC with its range from the flags.
"""

from __future__ import annotations

import grpc
import pytest
from datasets import write_records
from masters import pb, stub, wait_serving

from master.sessions import LOADER_SESSIONS, SessionRegistry, session_cap_refusal, trainer_cap
from paddlecloud.auth import JobTokens, auth_metadata


def test_the_cap_is_the_maximum_plus_a_margin_and_loader_workers_count_as_their_trainer():
    assert trainer_cap(3) == 7 and trainer_cap(100) == 200
    why = session_cap_refusal("x", trainers=7, new_trainer=True, sessions_of_trainer=0, maximum=3)
    assert why is not None and "cap (7: max_trainers 3 plus a margin of 4)" in why
    # a worker of a trainer that has sessions adds no trainer, up to LOADER_SESSIONS of them
    assert session_cap_refusal("6/0", trainers=7, new_trainer=False, sessions_of_trainer=1, maximum=3) is None
    full = session_cap_refusal("w/9", trainers=1, new_trainer=False, sessions_of_trainer=LOADER_SESSIONS,
                               maximum=3)
    assert "the cap of one trainer" in full


def test_the_registry_counts_trainers_as_sessions_come_and_go():
    registry = SessionRegistry()
    registry.load({"0": 1, "0/1": 2}, {}, at=0)
    assert registry.bases == {"0": 2}
    registry.add("1", 3, supersedes=None, at=0)
    registry.add("1", 4, supersedes=3, at=0)  # a supersede: still one session of trainer 1
    assert registry.bases == {"0": 2, "1": 1}
    registry.remove(4)
    registry.remove(3)  # superseded already: nothing more to count
    assert registry.bases == {"0": 2}


async def test_registrations_past_the_cap_are_resource_exhausted_naming_it(tmp_path, start_master):
    write_records(tmp_path / "data", files=2, records_per_file=2)
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    master = start_master("--input", str(tmp_path / "data"), "--tokens-dir", str(tmp_path / "tokens"),
                          "--trainers", "3")
    await wait_serving(master.address, process=master)
    trainer = auth_metadata(tokens.trainer)
    async with grpc.aio.insecure_channel(master.address) as channel:
        s = stub(channel)
        for n in range(trainer_cap(3)):
            await s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=f"fake-{n}"), metadata=trainer)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="one-too-many"), metadata=trainer)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "its cap (7: max_trainers 3" in refused.value.details(), refused.value.details()
        # the same ids again: each supersedes its own session, none counts twice
        for n in range(trainer_cap(3)):
            await s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=f"fake-{n}"), metadata=trainer)
        # a session that leaves frees its place
        reply = await s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="fake-0"), metadata=trainer)
        await s.LeaveTrainer(pb.LeaveTrainerRequest(session_id=reply.session_id),
                             metadata=auth_metadata(reply.session_token))
        await s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="one-too-many"), metadata=trainer)
