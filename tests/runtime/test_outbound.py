"""The outbound guard's pure parts (``runtime/outbound.py``) and the secret rule
(``runtime/secrets.py``): address categories, IPv6 forms, host forms, URLs,
services, resolution with a stub resolver, settings parsing, and the guarded httpx transport
against real loopback servers (size cap, redirects re-checked per hop, proxies ignored). The
hostile-URL table through every real client is tests/security/test_p3_ssrf.py."""

from __future__ import annotations

import gzip
import ipaddress
import os
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from runtime import outbound, outbound_http
from runtime.outbound import (
    OutboundPolicy,
    OutboundRefused,
    ResponseTooLarge,
    address_category,
    canonical_host,
    check_url,
    host_listed,
    parse_hosts,
    parse_private_mode,
    parse_schemes,
    resolve_checked,
    service,
    service_at,
)
from runtime.secrets import (
    SecretNotAllowed,
    api_key_configured,
    api_key_from_env,
    check_secret_name,
    parse_secret_rule,
)
from tests.support.canary import Canary, Redirector

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("address", "category", "never"),
    [
        ("8.8.8.8", "public", False),
        ("2606:4700::1111", "public", False),
        ("127.0.0.1", "a loopback address", False),
        ("127.255.0.9", "a loopback address", False),
        ("::1", "a loopback address", False),
        ("10.0.0.1", "a private address", False),
        ("172.31.255.255", "a private address", False),
        ("192.168.1.1", "a private address", False),
        ("100.64.0.1", "a shared (carrier-grade NAT) address", False),
        ("fd12::1", "a unique local address", False),
        ("169.254.169.254", "a cloud metadata address", True),
        ("169.254.1.1", "a link-local address", True),
        ("fe80::1", "a link-local address", True),
        ("fd00:ec2::254", "a cloud metadata address", True),
        ("100.100.100.200", "a cloud metadata address", True),
        ("0.0.0.0", "an unspecified address", True),  # noqa: S104
        ("::", "an unspecified address", True),
        ("224.0.0.251", "a multicast address", True),
        ("ff02::1", "a multicast address", True),
        ("255.255.255.255", "a broadcast address", True),
        ("240.1.2.3", "a reserved address", True),
        ("0.1.2.3", "a 'this network' (reserved) address", True),
        ("192.0.2.10", "a reserved (documentation) address", True),
        # IPv6 forms carrying an IPv4 address are judged by that address.
        ("::ffff:127.0.0.1", "a loopback address", False),
        ("::ffff:169.254.169.254", "a cloud metadata address", True),
        ("::169.254.169.254", "a cloud metadata address", True),
        ("::ffff:0:a9fe:a9fe", "a cloud metadata address", True),
        ("64:ff9b::7f00:1", "a loopback address", False),
        ("64:ff9b:1::a9fe:a9fe", "a cloud metadata address", True),
        ("2002:a9fe:a9fe::1", "a cloud metadata address (carried in 2002:a9fe:a9fe::1)", True),
        ("2002:0a00:0001::1", "a private address (carried in 2002:a00:1::1)", False),
    ],
)
def test_address_categories(address: str, category: str, never: bool) -> None:
    assert address_category(ipaddress.ip_address(address)) == (category, never)


@pytest.mark.parametrize(
    ("host", "meaning"),
    [("2130706433", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
     ("127.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("127.000.0.1", "127.0.0.1"),
     ("0", "0.0.0.0"), ("017700000001", "127.0.0.1")],  # noqa: S104
)  # fmt: skip
def test_non_canonical_numeric_hosts_are_refused_naming_their_meaning(
    host: str, meaning: str
) -> None:
    with pytest.raises(OutboundRefused, match=f"non-canonical numeric host.*{meaning}") as refused:
        canonical_host(host)
    assert refused.value.rule == "host"


def test_host_names_are_made_canonical() -> None:
    assert canonical_host("Example.COM.") == "example.com"
    assert canonical_host("[::FFFF:127.0.0.1]") == "::ffff:7f00:1"
    fullwidth = "\uff11\uff12\uff17.\uff10.\uff10.\uff11"  # "127.0.0.1" in full-width digits
    assert canonical_host(fullwidth) == "127.0.0.1"  # IDNA folds them, as the resolver would
    for bad in ("fe80::1%25eth0", "exa mple.com", "a..b", "-x.com", ""):
        with pytest.raises(OutboundRefused):
            canonical_host(bad)
    with pytest.raises(OutboundRefused, match="cloud metadata host name") as refused:
        canonical_host("METADATA.google.internal.")
    assert refused.value.rule == "metadata"


def test_urls_are_checked_before_any_lookup() -> None:
    policy = OutboundPolicy()
    target = check_url("https://models.example.test:8443/v1", policy)
    assert (target.scheme, target.host, target.port) == ("https", "models.example.test", 8443)
    assert check_url("http://[::1]/v1", policy).port == 80
    cases = {
        "file:///etc/passwd": "scheme 'file' is not allowed",
        "gopher://127.0.0.1:70/_x": "scheme 'gopher'",
        "/etc/passwd": r"scheme '\(none\)'",
        "http://user:pw@example.test/": "credentials in the URL",
        "http://example.test:0/": "port 0",
        "http://example.test:99999/": "not a valid URL",
        "http:///v1": "no host",
        "http://127.0.0.1\\@example.test/": "control characters or",
        "http://example.test /": "spaces",
    }
    for url, message in cases.items():
        with pytest.raises(OutboundRefused, match=message):
            check_url(url, policy)


def test_deny_refuses_private_and_loopback_allow_admits_them() -> None:
    allow, deny = OutboundPolicy(), OutboundPolicy(private="deny")
    for url in ("http://127.0.0.1:8080/", "http://10.1.2.3/", "http://[fd00::5]/"):
        check_url(url, allow)
        with pytest.raises(OutboundRefused, match="LOOPWRIGHT_OUTBOUND_PRIVATE=deny") as refused:
            check_url(url, deny)
        assert refused.value.rule == "private"
    check_url("http://93.184.216.34/", deny)


def test_backing_services_are_refused_in_every_mode_and_on_every_loopback_form() -> None:
    local = service_at("REDIS_URL", "localhost", 6379, resolver=lambda h, p: ["127.0.0.1"])
    remote = service(
        "DATABASE_URL", "postgres://u:p@db.internal:5433/x", resolver=lambda h, p: ["10.0.0.7"]
    )
    assert remote is not None and (remote.host, remote.port) == ("db.internal", 5433)
    policy = OutboundPolicy(services=(local, remote))
    for url in ("http://127.0.0.1:6379/", "http://127.0.0.2:6379/", "http://[::1]:6379/",
                "http://[::ffff:127.0.0.1]:6379/", "http://10.0.0.7:5433/",
                "http://db.internal:5433/"):  # fmt: skip
        with pytest.raises(OutboundRefused, match="server's own service") as refused:
            check_url(url, policy)
        assert refused.value.rule == "service"
    check_url("http://127.0.0.1:6380/", policy)
    check_url("http://10.0.0.7:80/", policy)
    assert service("X", "sqlite:///var/x.sqlite3") is None
    assert service("X", "filesystem://") is None


class StubResolver:
    """Answers from a table; a list of answers is used in turn (the last one repeats)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        turns = self.answers[host]
        return turns[min(len([c for c in self.calls if c == host]) - 1, len(turns) - 1)]


def test_every_resolved_address_is_checked_and_one_bad_one_refuses_the_name() -> None:
    stub = StubResolver(
        {
            "rebind.test": [["93.184.216.34"], ["127.0.0.1"]],
            "mixed.test": [["93.184.216.34", "169.254.169.254"]],
            "public.test": [["93.184.216.34", "2606:4700::1111"]],
        }
    )
    deny = OutboundPolicy(private="deny", resolver=stub)
    assert resolve_checked("public.test", 443, deny) == ["93.184.216.34", "2606:4700::1111"]
    assert resolve_checked("rebind.test", 80, deny) == ["93.184.216.34"]  # the first answer
    with pytest.raises(OutboundRefused, match=r"rebind.test \(127.0.0.1\) is a loopback"):
        resolve_checked("rebind.test", 80, deny)  # the next answer, at connect time
    with pytest.raises(OutboundRefused, match=r"mixed.test \(169.254.169.254\).*metadata"):
        resolve_checked("mixed.test", 80, OutboundPolicy(resolver=stub))
    with pytest.raises(OutboundRefused):
        resolve_checked("metadata.google.internal", 80, OutboundPolicy(resolver=stub))
    assert "metadata.google.internal" not in stub.calls  # refused by name, never looked up


def test_settings_parsing_names_the_variable() -> None:
    assert parse_private_mode(None) == "allow"
    assert parse_private_mode(" Deny ") == "deny"
    with pytest.raises(ValueError, match="LOOPWRIGHT_OUTBOUND_PRIVATE must be 'allow' or 'deny'"):
        parse_private_mode("sometimes")
    schemes = {"setting": "LOOPWRIGHT_GIT_SCHEMES", "default": "https"}
    assert parse_schemes(None, **schemes, permitted=("http", "https")) == {"https"}
    assert parse_schemes("https, HTTP", **schemes, permitted=("http", "https")) == {"http", "https"}
    for bad in ("file", "https,ssh", ""):
        with pytest.raises(ValueError, match="LOOPWRIGHT_GIT_SCHEMES may list only http, https"):
            parse_schemes(bad, **schemes, permitted=("http", "https"))
    hosts = parse_hosts("github.com, *.example.com", setting="LOOPWRIGHT_GIT_HOSTS")
    assert host_listed("github.com", hosts) and host_listed("git.example.com", hosts)
    assert not host_listed("example.com.evil.test", hosts) and not host_listed("xgithub.com", hosts)
    with pytest.raises(ValueError, match="LOOPWRIGHT_GIT_HOSTS lists 'a b'"):
        parse_hosts("a b", setting="LOOPWRIGHT_GIT_HOSTS")


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("", True), ("LOOPWRIGHT_SECRET_OPENAI", True), ("OPENAI_API_KEY", True),
        ("LOOPWRIGHT_SECRET_", False), ("SECRET_KEY", False), ("DATABASE_URL", False),
        ("PATH", False), ("HOME", False), ("LOOPWRIGHT_SECRET_PREFIX", False),
        ("LOOPWRIGHT_SECRET_ALLOW", False), ("loopwright_secret_x", False), ("AWS_SECRET", False),
        ("not a name", False),
    ],
)  # fmt: skip
def test_the_secret_rule(name: str, allowed: bool) -> None:
    problem = check_secret_name(name, "LOOPWRIGHT_SECRET_", {"OPENAI_API_KEY"})
    assert (problem is None) is allowed, problem
    if name == "SECRET_KEY":
        assert problem == (
            "api_key_env must name a variable starting with LOOPWRIGHT_SECRET_ or listed in "
            "LOOPWRIGHT_SECRET_ALLOW; SECRET_KEY is neither (it is one of the server's own "
            "variables)"
        )


def test_a_refused_name_is_never_read() -> None:
    environ = {"SECRET_KEY": "django-secret", "LOOPWRIGHT_SECRET_K": "sk-1"}
    rule = parse_secret_rule(None, None)
    with pytest.raises(SecretNotAllowed, match="SECRET_KEY is neither"):
        api_key_from_env("SECRET_KEY", environ, rule=rule)
    assert not api_key_configured("SECRET_KEY", environ, rule=rule)
    key = api_key_from_env("LOOPWRIGHT_SECRET_K", environ, rule=rule)
    assert key is not None and key.reveal() == "sk-1"


def test_the_secret_settings_may_not_expose_server_variables() -> None:
    assert parse_secret_rule("MY_KEYS_", "OPENAI_API_KEY").allow == {"OPENAI_API_KEY"}
    for prefix in ("LOOPWRIGHT_", "LOOPWRIGHT", "X", "bad prefix", "DATABASE"):
        with pytest.raises(ValueError, match="LOOPWRIGHT_SECRET_PREFIX"):
            parse_secret_rule(prefix, None)
    with pytest.raises(ValueError, match="may not list server settings: SECRET_KEY, PATH"):
        parse_secret_rule(None, "OPENAI_API_KEY, SECRET_KEY, PATH")
    with pytest.raises(ValueError, match="LOOPWRIGHT_VAR_DIR"):
        parse_secret_rule(None, "LOOPWRIGHT_VAR_DIR")


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LOOPWRIGHT_OUTBOUND_PRIVATE", "maybe", "LOOPWRIGHT_OUTBOUND_PRIVATE must be 'allow'"),
        ("LOOPWRIGHT_SECRET_ALLOW", "SECRET_KEY", "may not list server settings: SECRET_KEY"),
        ("LOOPWRIGHT_GIT_SCHEMES", "file", "LOOPWRIGHT_GIT_SCHEMES may list only"),
        ("LOOPWRIGHT_APPROVAL_WEBHOOK_URL", "http://169.254.169.254/", "cloud metadata"),
    ],
)
def test_a_bad_setting_stops_the_process_at_start(
    variable: str, value: str, message: str, tmp_path: Path
) -> None:
    env = {**os.environ, variable: value, "LOOPWRIGHT_VAR_DIR": str(tmp_path)}
    env["DJANGO_SETTINGS_MODULE"] = "orchestrator.settings"
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and message in done.stderr


# --- the guarded httpx transport, against real loopback servers ----------------------------


@pytest.fixture
def canary() -> Iterator[Canary]:
    with Canary() as running:
        yield running


def test_redirects_are_not_followed_and_each_followed_hop_is_checked(canary: Canary) -> None:
    with Redirector(f"http://2130706433:{canary.port}/v1") as hop:
        with outbound_http.client(OutboundPolicy(), timeout=5) as http:
            assert http.get(hop.url()).status_code == 302  # not followed
        with (
            outbound_http.client(OutboundPolicy(), timeout=5, follow_redirects=True) as http,
            pytest.raises(OutboundRefused, match="non-canonical numeric host"),
        ):
            http.get(hop.url())
        hop.location = canary.url()
        with outbound_http.client(OutboundPolicy(), timeout=5, follow_redirects=True) as http:
            assert http.get(hop.url()).status_code == 200  # an allowed hop is followed
    assert canary.hits() == 1


def test_the_webhook_client_refuses_before_connecting(canary: Canary) -> None:
    deny = OutboundPolicy(private="deny")
    with pytest.raises(OutboundRefused, match="deny"):
        outbound_http.post_json(canary.url(), {"text": "x"}, policy=deny)
    assert canary.hits() == 0
    assert outbound_http.post_json(canary.url(), {"text": "x"}, policy=OutboundPolicy()) == 200
    assert canary.hits() == 1


class Bomb(Canary):
    def reply(self, path: str) -> tuple[int, dict[str, str], bytes]:
        body = gzip.compress(b"0" * 2**24)
        return 200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, body


def test_the_size_cap_applies_to_decoded_bytes() -> None:
    capped = OutboundPolicy(max_body_bytes=2**20)
    with Bomb() as bomb, outbound_http.client(capped, timeout=5) as http:
        with pytest.raises(ResponseTooLarge, match="larger than 1 MiB"):
            http.get(bomb.url())
        with pytest.raises(ResponseTooLarge):
            http.post(bomb.url(), json={})


@pytest.mark.anyio
async def test_proxy_variables_are_ignored(canary: Canary, monkeypatch: pytest.MonkeyPatch) -> None:
    with Canary() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url(""))
        monkeypatch.setenv("ALL_PROXY", proxy.url(""))
        context = httpx2.create_ssl_context()
        async with outbound_http.async_client(OutboundPolicy(), verify=context) as http:
            assert (await http.post(canary.url(), json={})).status_code == 200
        assert (canary.hits(), proxy.hits()) == (1, 0)


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", _raw_deflate)],
)
def test_the_inflater_undoes_each_encoding_chunk_by_chunk(
    encoding: str, pack: Callable[[bytes], bytes]
) -> None:
    body = pack(b'{"text": "' + b"y" * 5000 + b'"}')
    inflater = outbound.Inflater(encoding, 2**20)
    out = b"".join(inflater.feed(body[i : i + 7]) for i in range(0, len(body), 7))
    assert out == b'{"text": "' + b"y" * 5000 + b'"}'


def test_the_inflater_stops_at_its_cap_and_refuses_corrupt_or_unknown_bodies() -> None:
    with pytest.raises(ResponseTooLarge):
        outbound.Inflater("gzip", 1000).feed(gzip.compress(b"0" * 5000))
    with pytest.raises(zlib.error):
        outbound.Inflater("gzip", 1000).feed(b"not gzip at all")
    with pytest.raises(ValueError, match="unsupported Content-Encoding 'br'"):
        outbound.Inflater("br", 1000)
