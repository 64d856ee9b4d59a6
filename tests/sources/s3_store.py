"""Objects into the local S3 server (moto's server mode, started by tests/sources/conftest.py)."""

from __future__ import annotations


def put_objects(endpoint: str, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for name, content in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}" if prefix else name, Body=content)
