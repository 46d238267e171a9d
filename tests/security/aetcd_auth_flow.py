"""aetcd's auth flow (username/password, token on every call) against a server set up by
test_auth_clients.py. Usage: python aetcd_auth_flow.py HOST PORT; prints ``ALL OK``."""

from __future__ import annotations

import asyncio
import sys

import aetcd
import grpc


async def main(host: str, port: int) -> None:
    async with aetcd.Client(host=host, port=port, username="u", password="u-pw",
                            timeout=10) as c:
        await c.put(b"/t/ae", b"1")
        got = await c.get(b"/t/ae")
        assert got is not None and got.value == b"1", got
        try:
            await c.put(b"/x", b"1")
        except aetcd.exceptions.ClientError as e:  # aetcd maps no class to PermissionDenied
            cause = e.__cause__
            assert isinstance(cause, grpc.aio.AioRpcError), cause
            assert cause.code() == grpc.StatusCode.PERMISSION_DENIED, cause.code()
            assert str(e) == "etcdserver: permission denied", e
        else:
            raise AssertionError("a write outside the grant was accepted")
        await c.delete(b"/t/ae")
    print("user ok", flush=True)
    try:
        async with aetcd.Client(host=host, port=port, username="u", password="bad",
                                timeout=10) as c:
            await c.get(b"/t/ae")
    except aetcd.exceptions.InvalidArgumentError as e:
        assert "authentication failed, invalid user ID or password" in str(e), e
    else:
        raise AssertionError("a wrong password was accepted")
    async with aetcd.Client(host=host, port=port, timeout=10) as anon:
        try:
            await anon.get(b"/t/ae")
        except aetcd.exceptions.InvalidArgumentError as e:
            assert "etcdserver: user name is empty" in str(e), e
        else:
            raise AssertionError("an anonymous read was accepted")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
