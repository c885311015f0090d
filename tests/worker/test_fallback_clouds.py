"""Fallback from Bedrock streams that fail before content: exception frames inside a 200, invoke and Converse.

Two Bedrock endpoints on one fake cloud (``tools/fake_cloud.py``, a Bedrock API key as bearer):
the first answers a recorded event-stream body whose only or first message is an exception
(or an Anthropic error event in a ``chunk``), the second a body that completes.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from schema.contract import BlockDelta, StreamDone, StreamError
from schema.keys import Keys
from schema.validate import validate
from tests.worker.cloud_support import BEDROCK_API_KEY, fake_cloud
from tests.worker.routes import routing_worker
from tests.worker.support import make_job, settings_for, stored_events, submit, wait_done
from tools.fake_cloud import CloudConfig
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS
from worker.upstream import Credentials

OPERATIONS = {"bedrock_invoke": ("anthropic", {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
              "bedrock_converse": ("bedrock_converse", {"messages": [{"role": "user", "content": [{"text": "hi"}]}]})}
"""Transcript directory → (the job's API, a request of that API)."""


def _cases() -> list[tuple[str, str, str]]:
    """(directory, failing case, completing case) for every recorded body that fails retryably before content."""
    out = []
    for directory in OPERATIONS:
        ends = {path.name.split(".")[0]: replay_file(path)[0]
                for path in sorted((DEFAULT_ROOTS[0] / directory).glob("*.eventstream"))}
        ok = next(name for name, events in ends.items()
                  if isinstance(events[-1], StreamDone) and events[-1].status == "completed")
        out += [(directory, name, ok) for name, events in ends.items()
                if isinstance(events[-1], StreamError) and events[-1].error.retryable
                and not any(isinstance(e, BlockDelta) for e in events)]
    return out


def _toml(cloud: str, api: str, failing: str, ok: str) -> str:
    tables = "".join(f'[endpoints.{name}]\napi = "{api}"\nplatform = "bedrock"\nurl = "{cloud}"\nregion = "us-east-1"\n'
                     'auth = "aws"\nsecret_env = "BEDROCK_API_KEY"\n\n' for name in ("east", "west"))
    return tables + f'[models."routed"]\nendpoints = ["east", "west"]\nupstream_model = {{ east = "{failing}", ' \
                    f'west = "{ok}" }}\n'


def test_there_are_recorded_bedrock_failures_before_content_of_both_operations() -> None:
    assert {directory for directory, _, _ in _cases()} == set(OPERATIONS)


@pytest.mark.parametrize("case", _cases(), ids="/".join)
async def test_a_bedrock_exception_before_content_falls_back(case: tuple[str, str, str], redis_url: str, keys: Keys,
                                                            redis_client: aioredis.Redis) -> None:
    directory, failing, ok = case
    api, request = OPERATIONS[directory]
    async with fake_cloud(CloudConfig(bedrock_api_key=BEDROCK_API_KEY)) as (cloud, state):
        credentials = Credentials(environ={"BEDROCK_API_KEY": BEDROCK_API_KEY})
        async with routing_worker(settings_for(cloud, redis_url, keys, max_retries=0), keys,
                                  _toml(cloud, api, failing, ok), credentials=credentials):
            job = make_job(api, "routed", request=request)
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
            events = await stored_events(redis_client, keys, job.stream_id)
    end = events[-1]
    assert isinstance(end, StreamDone), end
    assert end.endpoint == "west"
    assert validate(events) == []
    assert [r["path"].split("/")[2] for r in state.requests] == [failing, ok]
