"""Tokens and credentials out of records: the object store refusing a write (moto's S3 server on 127.0.0.1 with IAM
enforced, a role that may read and list but not write: the boundary fake of S3's wire protocol) is a storage error,
exit 8, naming the store without the server's answer, whose body can echo `x-amz-security-token`; never "unexpected
error ... please report it", and nothing of it in Dagster's run storage. Credentials in `store.url` are refused when
the config loads, without echoing them."""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from tests.conftest import invoice

AS_OF = "2026-11-04T09:00:00Z"
SERVER_TEXT = ("AccessDenied", "Access Denied", "RequestId", "HostId", "<Error>", "403 Forbidden")


def customers(n: int) -> list[dict]:
    return [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(n)]


def config(tmp_path, url: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"shards: 2\nstore: {{url: '{url}'}}\n")
    return str(path)


@pytest.fixture
def read_only_s3(monkeypatch):
    """moto's S3 server with IAM enforced, a bucket, and the temporary credentials (with a session token) of a role
    that may list and read the bucket but not write to it, in the AWS_* environment. Yields the credentials."""
    import boto3
    from moto.core.authorization import enable_iam_authentication
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    admin = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing",
             "aws_secret_access_key": "testing"}  # fmt: skip
    bucket = f"dunning-{uuid.uuid4().hex[:8]}"  # moto keeps its state per process: this test's own bucket and role
    boto3.client("s3", **admin).create_bucket(Bucket=bucket)
    iam = boto3.client("iam", **admin)
    trust = {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}  # fmt: skip
    role = iam.create_role(RoleName=bucket, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    allowed = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}  # no s3:PutObject
    may = {"Version": "2012-10-17", "Statement": [allowed]}
    iam.put_role_policy(RoleName=bucket, PolicyName="read-only", PolicyDocument=json.dumps(may))
    credentials = boto3.client("sts", **admin).assume_role(RoleArn=role["Arn"], RoleSessionName="ingest")["Credentials"]
    for name, value in {
        "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
        "AWS_SESSION_TOKEN": credentials["SessionToken"], "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with enable_iam_authentication():
        yield {**credentials, "store": f"s3://{bucket}/acme"}
    server.stop()


def secrets_of(credentials: dict) -> tuple[str, ...]:
    return credentials["SessionToken"], credentials["SecretAccessKey"]


@pytest.mark.slow
def test_a_refused_write_is_exit_8_naming_the_store_without_the_servers_answer(deployment, tmp_path, read_only_s3):
    cfg = config(tmp_path, read_only_s3["store"])
    snapshot = str(deployment.snapshot(customers(4)))
    code, out, err = deployment.cli("ingest", "--snapshot", snapshot, "--as-of", AS_OF, "--config", cfg)
    assert code == 8, err
    assert err.startswith(f"dunning: storage error: the store {read_only_s3['store']} refused to write") and (
        "permission denied" in err
    ), err
    assert "please report it" not in err and "unexpected error" not in err and "Traceback" not in err
    for text in (*SERVER_TEXT, *secrets_of(read_only_s3)):
        assert text not in out + err
    for path in deployment.home.rglob("*"):  # nor anywhere under the home (the ledger, the pulled files)
        if path.is_file():
            assert not any(s.encode() in path.read_bytes() for s in secrets_of(read_only_s3)), path


@pytest.mark.slow
def test_a_refused_write_in_the_hourly_ingest_leaves_nothing_of_the_answer_in_dagsters_run_storage(
    deployment, tmp_path, read_only_s3
):
    from pipelines.cli.printing import failures as report
    from pipelines.definitions import defs
    from pipelines.instance import get_instance

    cfg = config(tmp_path, read_only_s3["store"])
    deployment.home.mkdir(parents=True)
    instance = get_instance(deployment.home)
    run_config = {
        "ops": {
            "ingested_snapshot": {"config": {"as_of": AS_OF, "snapshot_path": str(deployment.snapshot(customers(4)))}}
        },
        "resources": {"dunning_home": {"config": {"home": str(deployment.home), "config_path": cfg}}},
    }
    result = defs.resolve_job_def("dunning_ingest").execute_in_process(
        run_config=run_config, instance=instance, partition_key="2026-11-04", raise_on_error=False
    )
    assert not result.success
    text, code = report.failed_run_report(result)
    assert code == 8 and "refused to write" in text and read_only_s3["store"] in text, text
    recorded = json.dumps([r.to_json() if hasattr(r, "to_json") else str(r) for r in instance.all_logs(result.run_id)])
    assert "refused to write" in recorded, "the step's failure is on record, as our one line"
    for secret in (*SERVER_TEXT, *secrets_of(read_only_s3)):
        assert secret not in recorded, secret
    for path in (deployment.home / "dagster").rglob("*"):
        if path.is_file():
            assert not any(s.encode() in path.read_bytes() for s in secrets_of(read_only_s3)), path


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_reading_and_listing_still_work_with_the_read_only_role_and_refusals_there_are_exit_8(
    deployment, tmp_path, read_only_s3, monkeypatch
):
    cfg = config(tmp_path, read_only_s3["store"])
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "no ingest of 2 parts" in err, "listing is allowed: an empty store has no ingest"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-of-this-key")
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 8 and "refused to list ingests/" in err, err
    for text in (*SERVER_TEXT, read_only_s3["SessionToken"]):
        assert text not in err


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY@dunning-test/acme",
        "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@dunning-test/acme",
        "s3://dunning-test/acme?X-Amz-Security-Token=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    ],
)
def test_credentials_in_the_store_url_are_refused_at_config_load_without_echoing_them(deployment, tmp_path, url):
    cfg = config(tmp_path, url)
    snapshot = str(deployment.snapshot(customers(2)))
    for command in (["ingest", "--snapshot", snapshot], ["run", "--snapshot", snapshot, "--shard", "0/2"]):
        code, out, err = deployment.cli(*command, "--as-of", AS_OF, "--config", cfg)
        assert code == 2 and "store.url" in err and "AWS_" in err, err
        for secret in ("wJalrXUtnFEMI", "AKIAIOSFODNN7EXAMPLE", "EXAMPLEKEY"):
            assert secret not in out + err
    assert not (deployment.home / "store").exists()
