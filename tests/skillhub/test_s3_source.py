"""``s3`` skills read their files from a prefix of an S3-compatible bucket an admin lists
(``LOOPWRIGHT_SKILL_S3_BUCKETS``, none by default). A real moto server runs on loopback as a
subprocess; skills are saved through the REST API with an operator token and run by a real
skills worker whose credentials come from the AWS environment chain. Refusals: an unlisted
bucket or a malformed ref at save time (400 at ``/source_ref``), and at run time a missing
prefix, a ``..`` or empty key segment, the size and entry caps, a store that is not there."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from skillhub.models import Skill
from skillhub.services.s3ref import SETTING, S3Refused, parse_s3_buckets
from skillhub.services.s3source import s3_files
from skillhub.services.snapshots import snapshot_export, snapshot_import
from tests.skillhub.conftest import SkillsWorker, start_skills_worker
from tests.support.s3_server import CREDENTIALS, MotoS3Server
from tests.support.workers import ROOT

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]
PROBLEM = "application/problem+json"
BUCKET = "loopwright-skills"
OTHER = "someone-elses-bucket"
READS_FILES = (
    "import json, os\n"
    "exec(open('helper.py').read())\n"
    "print(greet(open('data/name.txt').read().strip()))\n"
    "print(json.dumps(sorted(os.listdir('.'))))\n"
    "print(sorted(k for k in os.environ if k.startswith('AWS')))\n"
)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3Server]:
    server = MotoS3Server(tmp_path_factory.mktemp("moto")).start()
    client = server.client()
    for bucket in (BUCKET, OTHER):
        client.create_bucket(Bucket=bucket)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_worker(
    moto: MotoS3Server, django_db_setup: None, django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SkillsWorker]:  # fmt: skip
    """A skills worker that reads ``BUCKET`` from the moto server (AWS env credentials)."""
    with django_db_blocker.unblock():
        worker = start_skills_worker(
            tmp_path_factory.mktemp("s3-worker"), "s3skills", **moto.env(BUCKET)
        )
    yield worker
    worker.kill()


@pytest.fixture
def s3_settings(moto: MotoS3Server, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process reads ``BUCKET`` from moto too (save-time checks, direct fetches)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    settings.SKILLHUB = {
        **settings.SKILLHUB,
        "S3_BUCKETS": (BUCKET,),
        "S3_ENDPOINT_URL": moto.url,
        "S3_TIMEOUT_SECONDS": 5.0,
    }
    return settings


def put(moto: MotoS3Server, prefix: str, files: dict[str, bytes], bucket: str = BUCKET) -> None:
    client = moto.client()
    for name, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}{name}", Body=data)


def hello_files(moto: MotoS3Server, prefix: str) -> None:
    put(moto, prefix, {
        "helper.py": b"def greet(name):\n    return 'hello ' + name\n",
        "data/name.txt": b"world\n",
        "data/": b"",  # a folder marker, as consoles write them: skipped
    })  # fmt: skip


def body(source_ref: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tool_name": "s3_skill", "title": "From S3", "code_template": READS_FILES,
        "language": "python", "input_schema": {"type": "object", "properties": {}},
        "source": "s3", "source_ref": source_ref, "timeout_seconds": 20,
    }  # fmt: skip
    data.update(overrides)
    return data


def refused(client: APIClient, source_ref: str) -> str:
    response = client.post("/api/v1/skills", body(source_ref), format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    [error] = [e for e in response.json()["errors"] if e["pointer"] == "/source_ref"]
    assert error["code"] == "not_allowed"
    assert not Skill.objects.exists()
    return str(error["detail"])


def run_through_api(client: APIClient, worker: SkillsWorker, name: str = "s3_skill") -> Any:
    response = client.post(f"/api/v1/skills/{name}/test", {"inputs": {}}, format="json")
    assert response.status_code == 200, (response.content, worker.log()[-3000:])
    return response.json()


# --- through the API and the real skills worker ---------------------------------------------


def test_an_s3_skill_reads_its_files_in_the_sandbox(
    s3_worker: SkillsWorker, moto: MotoS3Server, s3_settings: Any, operator_client: APIClient
) -> None:
    hello_files(moto, "skills/hello/")
    response = operator_client.post(
        "/api/v1/skills", body(f"s3://{BUCKET}/skills/hello/"), format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["source"] == "s3"
    execution = run_through_api(operator_client, s3_worker)
    assert execution["status"] == "succeeded", (execution, s3_worker.log()[-3000:])
    # The worker holds the credentials; the sandboxed program never sees them.
    assert execution["stdout"].splitlines() == ["hello world", '["data", "helper.py", "out"]', "[]"]
    # Changed in the bucket: the next run reads it as it is then (no cache).
    put(moto, "skills/hello/", {"data/name.txt": b"moto\n"})
    again = run_through_api(operator_client, s3_worker)
    assert again["stdout"].splitlines()[0] == "hello moto"
    events = operator_client.get(f"/api/v1/skill-executions/{again['id']}/events").json()
    rendering = next(e for e in events if e["type"] == "rendering")["data"]
    assert rendering["files"] == 2
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in json.dumps(events)
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in s3_worker.log()


def test_refusals_at_run_time_fail_the_execution_with_a_clear_error(
    s3_worker: SkillsWorker, moto: MotoS3Server, s3_settings: Any, operator_client: APIClient
) -> None:
    for name, ref in [("s3_missing", "nothing/here/"), ("s3_dotdot", "evil/"),
                      ("s3_other", "other/")]:  # fmt: skip
        response = operator_client.post(
            "/api/v1/skills", body(f"s3://{BUCKET}/{ref}", tool_name=name), format="json"
        )
        assert response.status_code == 201, response.content
    put(moto, "evil/", {"ok.txt": b"fine", "../escape.txt": b"x"})
    missing = run_through_api(operator_client, s3_worker, "s3_missing")
    assert missing["status"] == "failed" and missing["attempts"] == 1
    assert missing["error"].startswith("S3Refused: no objects under")
    dotdot = run_through_api(operator_client, s3_worker, "s3_dotdot")
    assert dotdot["status"] == "failed"
    assert "'..' segment" in dotdot["error"] and "S3Refused" in dotdot["error"]
    # The worker's own allow list counts: this process allows OTHER, the worker does not.
    s3_settings.SKILLHUB = {**s3_settings.SKILLHUB, "S3_BUCKETS": (BUCKET, OTHER)}
    put(moto, "other/", {"a.txt": b"a"}, bucket=OTHER)
    Skill.objects.filter(tool_name="s3_other").update(source_ref=f"s3://{OTHER}/other/")
    other = run_through_api(operator_client, s3_worker, "s3_other")
    assert other["status"] == "failed"
    assert f"the bucket '{OTHER}' is not one allowed by {SETTING}" in other["error"]


# --- at save time -----------------------------------------------------------------------------


def test_without_buckets_every_s3_skill_is_refused(
    operator_client: APIClient, settings: Any
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "S3_BUCKETS": ()}
    detail = refused(operator_client, f"s3://{BUCKET}/skills/hello/")
    assert "s3 skills are off" in detail and SETTING in detail


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (f"s3://{OTHER}/x/", f"not one allowed by {SETTING}"),
        (f"https://{BUCKET}/x/", "of the form s3://bucket/prefix/"),
        ("s3://Not_A_Bucket/x/", "is not a bucket name"),
        (f"s3://{BUCKET}/skills/../secrets/", "'..' segment"),
        (f"s3://{BUCKET}//abs/", "is absolute"),
        (f"s3://{BUCKET}/a//b/", "empty"),
    ],
)
def test_a_ref_outside_the_rule_is_refused(
    operator_client: APIClient, s3_settings: Any, ref: str, expected: str
) -> None:
    assert expected in refused(operator_client, ref)


def test_the_settings_come_from_the_environment_and_a_bad_bucket_stops_the_start() -> None:
    assert parse_s3_buckets(" a-bucket, b.bucket ,,a-bucket") == ("a-bucket", "b.bucket")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "orchestrator.settings", SETTING: "ok,Bad_One"}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr and SETTING in started.stderr
    names = ("S3_BUCKETS", "S3_ENDPOINT_URL", "S3_REGION", "S3_TIMEOUT_SECONDS")
    env.update({
        SETTING: "a-bucket", "LOOPWRIGHT_SKILL_S3_ENDPOINT_URL": "http://127.0.0.1:9",
        "LOOPWRIGHT_SKILL_S3_REGION": "eu-west-3", "LOOPWRIGHT_SKILL_S3_TIMEOUT_SECONDS": "2.5",
    })  # fmt: skip
    script = (
        "import django, json; django.setup()\nfrom django.conf import settings\n"
        f"print(json.dumps([settings.SKILLHUB[n] for n in {names!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read == [["a-bucket"], "http://127.0.0.1:9", "eu-west-3", 2.5]


# --- the fetch itself (this process, the same moto server) -----------------------------------


def test_the_fetch_keeps_to_the_caps_and_refuses_odd_keys(
    moto: MotoS3Server, s3_settings: Any
) -> None:
    put(moto, "capped/", {"a.bin": b"x" * 600, "b.bin": b"y" * 600, "c/d.txt": b"d"})
    with pytest.raises(S3Refused, match="over 1024 bytes"):
        s3_files(f"s3://{BUCKET}/capped/", max_bytes=1024)
    with pytest.raises(S3Refused, match="more than 2 objects"):
        s3_files(f"s3://{BUCKET}/capped/", max_entries=2)
    copy = s3_files(f"s3://{BUCKET}/capped")  # the trailing '/' is implied
    assert sorted(copy.files) == ["a.bin", "b.bin", "c/d.txt"]
    put(moto, "empty-seg/", {"a//b.txt": b"x"})
    with pytest.raises(S3Refused, match=r"empty, '\.' or '\.\.' segment"):
        s3_files(f"s3://{BUCKET}/empty-seg/")
    put(moto, "clash/", {"c": b"file", "c/d.txt": b"in a folder"})
    with pytest.raises(S3Refused, match="both an object and a folder"):
        s3_files(f"s3://{BUCKET}/clash/")


def test_a_missing_bucket_or_an_absent_store_fails_fast(
    moto: MotoS3Server, s3_settings: Any
) -> None:
    s3_settings.SKILLHUB = {**s3_settings.SKILLHUB, "S3_BUCKETS": (BUCKET, "no-such-bucket")}
    with pytest.raises(S3Refused, match=r"the bucket or an object is missing \(NoSuchBucket\)"):
        s3_files("s3://no-such-bucket/x/")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    s3_settings.SKILLHUB = {
        **s3_settings.SKILLHUB, "S3_ENDPOINT_URL": closed, "S3_TIMEOUT_SECONDS": 1.0,
    }  # fmt: skip
    started = time.monotonic()
    with pytest.raises(S3Refused, match="cannot be read: Could not connect"):
        s3_files(f"s3://{BUCKET}/capped/")
    assert time.monotonic() - started < 30


def test_a_snapshot_of_an_s3_skill_keeps_its_source_ref(
    moto: MotoS3Server, s3_settings: Any, operator_client: APIClient
) -> None:
    ref = f"s3://{BUCKET}/skills/hello/"
    response = operator_client.post("/api/v1/skills", body(ref), format="json")
    assert response.status_code == 201, response.content
    exported = snapshot_export()
    with zipfile.ZipFile(io.BytesIO(exported.data)) as zf:
        [entry] = json.loads(zf.read("manifest.json"))["skills"]
    assert (entry["source"], entry["source_ref"], entry["archive"]) == ("s3", ref, None)
    Skill.objects.all().delete()
    report = snapshot_import(data=exported.data, actor="test")
    assert report.created == ["s3_skill"]
    assert Skill.objects.get().source_ref == ref
    s3_settings.SKILLHUB = {**s3_settings.SKILLHUB, "S3_BUCKETS": (OTHER,)}
    Skill.objects.all().delete()
    with pytest.raises(Exception, match=f"not one allowed by {SETTING}"):
        snapshot_import(data=exported.data, actor="test")
    assert not Skill.objects.exists()
