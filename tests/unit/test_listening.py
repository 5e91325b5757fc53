"""gateway/edge/listening.py: the kernel says which ports listen (netlink, else /proc's tables), with
no connection tried."""
import asyncio
import socket
import time

import pytest

from gateway.edge import listening
from tests.conftest import on_a_new_loop


@pytest.fixture
def bound():
    """A socket bound to a free port of the loopback, not yet listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def test_a_port_listens_once_its_socket_listens_and_not_when_it_is_only_bound(bound):
    port = bound.getsockname()[1]
    assert port not in listening.listening_ports()
    bound.listen()
    assert port in listening.listening_ports()


def test_netlink_and_the_tables_name_the_same_listening_ports_of_both_families(bound):
    """The same sockets either way: IPv4 and IPv6 listeners, and neither a bound socket that does
    not listen nor a connection's ends."""
    port = bound.getsockname()[1]
    with socket.socket(socket.AF_INET6) as six, socket.socket() as listener:
        six.bind(("::1", 0))
        six.listen()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            diagnosed = listening.diagnosed_listening_ports()
            assert diagnosed is not None, "netlink's socket diagnostics refused here"
            assert diagnosed == listening.table_listening_ports()
            assert {six.getsockname()[1], listener.getsockname()[1]} <= diagnosed
            assert port not in diagnosed and client.getsockname()[1] not in diagnosed


def test_the_tables_answer_where_netlink_is_refused(bound, monkeypatch):
    monkeypatch.setattr(listening, "diagnosed_listening_ports", lambda: None)
    bound.listen()
    assert bound.getsockname()[1] in listening.listening_ports()


def test_no_readable_table_is_no_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(listening, "diagnosed_listening_ports", lambda: None)
    assert listening.listening_ports((str(tmp_path / "absent"),)) is None


@pytest.mark.parametrize(("address", "port"), [
    ("127.0.0.1:5000", 5000), ("0.0.0.0:5001", 5001), ("localhost:5002", 5002), ("[::1]:5003", 5003),
    ("grpc://127.0.0.1:5004", 5004), ("10.1.2.3:5005", None), ("executor-0.llm:5006", None), ("127.0.0.1", None)])
def test_only_this_machines_addresses_have_a_local_port(address, port):
    assert listening.local_port(address) == port


def test_each_deployment_may_be_tried_once_one_of_its_replicas_listens_or_is_elsewhere():
    assert listening.reachable([["127.0.0.1:5000", "127.0.0.1:5001"]], {5001})
    assert not listening.reachable([["127.0.0.1:5000"], ["127.0.0.1:5001"]], {5001})
    assert listening.reachable([["127.0.0.1:5000"], ["llm-0.llm:5001"]], {5000})


def test_the_wait_ends_as_the_executor_starts_listening(bound):
    port = bound.getsockname()[1]

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, bound.listen)
        started = time.monotonic()
        ready = await listening.until_listening([[f"127.0.0.1:{port}"]], limit_s=10, waiting=lambda: said.append(1))
        return ready, time.monotonic() - started
    said: list[int] = []
    ready, waited = on_a_new_loop(scenario())
    assert ready and 0.25 <= waited < 2.0
    assert said == [1]  # once, however long the wait


def test_the_wait_gives_up_at_its_limit_or_when_cancelled(bound):
    port = bound.getsockname()[1]

    async def scenario() -> tuple[bool, bool]:
        at_limit = await listening.until_listening([[f"127.0.0.1:{port}"]], limit_s=0.1)
        cancelled = asyncio.Event()
        cancelled.set()
        return at_limit, await listening.until_listening([[f"127.0.0.1:{port}"]], cancelled)
    assert on_a_new_loop(scenario()) == (False, False)
