"""The s3:// backend of tiered storage, through aiobotocore.

Why aiobotocore: it is botocore (the AWS SDK's own request signing, credential chain,
retries and endpoint rules, kept by AWS) driven by aiohttp, which the broker already runs
on: S3 calls are coroutines on the broker's event loop, with no thread per request and
no second HTTP stack. boto3 in a thread would block one worker thread per call in flight.

`s3://bucket/prefix`: objects go under `prefix/` in `bucket`. Credentials and region come
from the usual AWS variables and files (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, ~/.aws, instance roles: botocore's
default chain); `--remote-storage-endpoint` points at another S3-compatible server.

Puts: one PutObject up to MULTIPART_PART_BYTES, else a multipart upload of parts of that
size, paced by the uploader's throttle part by part (at most one part in memory per
upload). Either way the object appears whole or not at all (CompleteMultipartUpload),
and a failed multipart upload is aborted, so the same key can be written again.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from dmq.tiered.objects import ObjectNotFound, ObjectStoreError, Throttle

# S3's smallest part but the last is 5 MiB; larger parts mean fewer requests and more
# memory per upload in flight (remote_upload_concurrency of them).
MULTIPART_PART_BYTES = 8 * 1024 * 1024
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix without slashes at its ends)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{url!r}: s3://bucket/prefix")
    return bucket, prefix.strip("/")


class S3Store:
    def __init__(self, url: str, endpoint_url: str | None = None) -> None:
        self.url = url
        self.bucket, self._prefix = parse_s3_url(url)
        self._endpoint_url = endpoint_url or None
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    async def _s3(self) -> Any:
        if self._client is None:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            self._client = await self._stack.enter_async_context(
                get_session().create_client(
                    "s3", endpoint_url=self._endpoint_url, region_name=region or "us-east-1"
                )
            )
        return self._client

    async def put_file(self, key: str, fd: int, size: int, throttle: Throttle) -> None:
        s3 = await self._s3()
        name = self._key(key)
        try:
            if size <= MULTIPART_PART_BYTES:
                await throttle(size)
                await s3.put_object(Bucket=self.bucket, Key=name, Body=os.pread(fd, size, 0))
                return
            upload = await s3.create_multipart_upload(Bucket=self.bucket, Key=name)
            upload_id = upload["UploadId"]
            try:
                parts = []
                for number, position in enumerate(range(0, size, MULTIPART_PART_BYTES), 1):
                    n = min(MULTIPART_PART_BYTES, size - position)
                    await throttle(n)
                    answer = await s3.upload_part(
                        Bucket=self.bucket, Key=name, UploadId=upload_id, PartNumber=number,
                        Body=os.pread(fd, n, position),
                    )  # fmt: skip
                    parts.append({"ETag": answer["ETag"], "PartNumber": number})
                await s3.complete_multipart_upload(
                    Bucket=self.bucket, Key=name, UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )  # fmt: skip
            except BaseException:
                with contextlib.suppress(Exception):
                    await s3.abort_multipart_upload(
                        Bucket=self.bucket, Key=name, UploadId=upload_id
                    )
                raise
        except (ClientError, BotoCoreError, OSError) as exc:
            raise ObjectStoreError(f"put {key}: {exc}") from exc

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        s3 = await self._s3()
        try:
            answer = await s3.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
            )
            async with answer["Body"] as body:
                return bytes(await body.read())
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _NOT_FOUND:
                raise ObjectNotFound(key) from None
            if code == "InvalidRange":  # at or past the end
                return b""
            raise ObjectStoreError(f"get {key}: {exc}") from exc
        except (BotoCoreError, OSError) as exc:
            raise ObjectStoreError(f"get {key}: {exc}") from exc

    async def delete(self, key: str) -> None:
        s3 = await self._s3()
        try:
            await s3.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError, OSError) as exc:
            raise ObjectStoreError(f"delete {key}: {exc}") from exc

    async def list_keys(self, prefix: str) -> list[str]:
        s3 = await self._s3()
        strip = len(self._key(""))
        keys: list[str] = []
        try:
            pages = s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix)
            )
            async for page in pages:
                keys += [item["Key"][strip:] for item in page.get("Contents", [])]
        except (ClientError, BotoCoreError, OSError) as exc:
            raise ObjectStoreError(f"list {prefix}: {exc}") from exc
        return sorted(keys)

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None
