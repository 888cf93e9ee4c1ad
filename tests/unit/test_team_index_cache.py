"""Issue 25 item 2, the builder's side: the team index as the cache after the local one -- the options that name it
(--team-index, APEXKIT_INDEX, --no-team-index), the cache key that stays the same with another credential, and the
builder publishing a hit from an injected lookup (a fake here; tests/e2e/test_team_index_cache.py runs the real one
over HTTP) or compiling, after one line, when the lookup fails or its wheel does not fit."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import wheelnames

from apexkit import commands
from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import builder, buildplan, options, sbom
from apexkit.wheel.cache import RemoteHit, WheelCache
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions

INTERP = Interpreter("/usr/bin/python3.11", "3.11", "3.11.2", "cpython", "x86_64", "/usr", "", "")
WHEEL = wheelnames.fixture_wheel()
KEY = "ab" + "c" * 62
SECRET = "s3cr%2Ft"  # a password holding '/', percent-encoded
INDEX = f"http://alice:{SECRET}@127.0.0.1:8080/team/"
SHOWN = "http://alice:***@127.0.0.1:8080/team/"


def resolve(*argv: str, **env: str) -> BuildOptions:
    return options.resolve("3.11", list(argv), env=env)


# --- configuration ---------------------------------------------------------------------------------------------


def test_team_indexes_come_from_the_flag_else_the_environment(tmp_path):
    assert resolve().team_indexes == ()
    env = {"APEXKIT_INDEX": f" {INDEX} ,file://{tmp_path}/a/\n{tmp_path}/b  {INDEX}"}
    assert resolve(**env).team_indexes == (INDEX, str(tmp_path / "a"), str(tmp_path / "b"))
    # the flag replaces the variable for one run, repeatable; --no-team-index asks none
    assert resolve("--team-index", "http://127.0.0.1:9/x", **env).team_indexes == (
        "http://127.0.0.1:9/x/",
    )
    assert resolve("--no-team-index", **env).team_indexes == ()
    assert resolve("--team-index", "rel/idx", "--team-index", "file:///srv/i").team_indexes == (
        str(Path("rel/idx").resolve()),
        "/srv/i",
    )


@pytest.mark.parametrize(
    "value, says",
    [
        ("http://alice:pa/ss@127.0.0.1:8080/team/", "password"),
        ("http://alice:pa#ss@127.0.0.1:8080/team/", "encode"),
        ("ftp://alice:pass@127.0.0.1/team/", "not a team index scheme"),
        ("file://otherhost/srv/index", "local absolute path"),
        ("http://alice:pass@127.0.0.1/te\nam/", "line break"),
    ],
)
def test_a_bad_team_index_is_one_line_that_never_quotes_the_password(value, says):
    for argv, env in ((["--team-index", value], {}), ([], {"APEXKIT_INDEX": value})):
        if "\n" in value and env:
            continue  # the variable's whitespace separates indexes
        with pytest.raises(ConfigError) as err:
            resolve(*argv, **env)
        text = err.value.format()
        assert says in text and "\n" not in text
        for secret in ("pa/ss", "pa#ss", "pass@", "alice"):
            assert secret not in text


def test_team_index_and_no_team_index_contradict():
    with pytest.raises(ConfigError, match="contradict"):
        resolve("--team-index", INDEX, "--no-team-index")


def test_the_team_indexes_travel_in_the_options_json_and_back():
    opts = resolve("--team-index", INDEX)
    again = options.from_json(json.loads(json.dumps(options.to_json(opts))), "3.11")
    assert again.team_indexes == (INDEX,)


def test_no_lookup_without_indexes_or_with_no_cache():
    assert commands.team_index_lookup(resolve()) is None
    assert commands.team_index_lookup(resolve("--team-index", INDEX, "--no-cache")) is None
    assert commands.team_index_lookup(resolve("--no-team-index", APEXKIT_INDEX=INDEX)) is None
    assert callable(commands.team_index_lookup(resolve("--team-index", INDEX)))


# --- the cache key: the same on every machine for the same inputs ------------------------------------------------


def _key(torch_index_url: str | None) -> str:
    opts = BuildOptions(python="3.11", torch_index_url=torch_index_url)
    m = matrix.load()
    plan = buildplan.make_plan(opts, m, INTERP, "2.13.0", env={})
    return buildplan.cache_key(plan, opts, "a" * 40, "b" * 40, [], m)


def test_the_cache_key_holds_no_credential_of_the_torch_index():
    public = _key("https://mirror.example.com/whl/cpu/")
    assert _key("https://alice:tok1@mirror.example.com/whl/cpu/") == public
    assert _key("https://bob:tok2@mirror.example.com/whl/cpu/") == public
    assert _key("https://other.example.com/whl/cpu/") != public  # another index is another input
    assert _key(None) != public


# --- the builder: a hit from the lookup, or a compile after one line ----------------------------------------------


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("apex/__init__.py", "")
    return buf.getvalue()


def _manifest(data: bytes, name: str = WHEEL, key: str = KEY) -> tuple[dict, dict[str, bytes]]:
    documents = {sbom.SBOM_FILE: b'{"sbom": 1}\n', sbom.PROVENANCE_FILE: b'{"prov": 1}\n'}
    record = {
        kind: {"file": file, "sha256": hashlib.sha256(documents[file]).hexdigest()}
        for kind, file in (("sbom", sbom.SBOM_FILE), ("provenance", sbom.PROVENANCE_FILE))
    }
    manifest = {
        "wheel": {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)},
        "cache_key": key,
        "cache_hit": False,
        "created": "2026-12-01T10:00:00Z",
        "durations_s": {"compile": 30.0, "total": 50.0},
        "ccache": {"hits": 0, "misses": 2, "hit_rate": 0.0},
        "attestations": record,
    }
    return manifest, documents


class Fake:
    """A RemoteLookup: writes the wheel it holds into the work directory it is given, as remote.fetch does."""

    def __init__(self, name: str = WHEEL, key: str = KEY, raises: Exception | None = None) -> None:
        self.name, self.key, self.raises = name, key, raises
        self.asked: list[str] = []
        self.data = _wheel_bytes()

    def __call__(self, key: str, work: Path) -> RemoteHit | None:
        self.asked.append(key)
        if self.raises is not None:
            raise self.raises
        manifest, documents = _manifest(self.data, self.name, self.key)
        (work / self.name).write_bytes(self.data)
        return RemoteHit(work / self.name, manifest, documents, SHOWN)


def _builder(tmp_path: Path, fake: Fake) -> tuple[builder.Builder, buildplan.Plan, Path]:
    opts = BuildOptions(
        python="3.11",
        dist_dir=tmp_path / "dist",
        build_dir=tmp_path / "build",
        cache_dir=tmp_path / "cache",
    )
    b = builder.Builder(opts, env={}, remote=fake)
    plan = buildplan.make_plan(opts, b.m, INTERP, "2.13.0", env={})
    work = tmp_path / "build" / plan.target_id
    work.mkdir(parents=True)
    b.state.use_cache, b.state.cache_key = True, KEY
    return b, plan, work


def test_a_team_index_hit_is_kept_in_the_local_cache_and_published_as_a_cache_hit(tmp_path, capfd):
    fake = Fake()
    b, plan, work = _builder(tmp_path, fake)
    hit = b._team_index_hit(KEY, plan, INTERP, work)
    assert hit is not None and hit[1] == SHOWN and fake.asked == [KEY]
    final = b._publish_cached(plan, hit[0], INTERP, work, source=hit[1])
    out = capfd.readouterr()
    text = out.out + out.err
    digest = hashlib.sha256(fake.data).hexdigest()
    assert f"✓ wheel cache hit from {SHOWN}: {WHEEL} sha256 {digest[:12]}" in text
    assert SECRET not in text
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["cache_hit"] is True and manifest["cache_source"] == SHOWN
    assert manifest["wheel"]["sha256"] == digest and (final / WHEEL).read_bytes() == fake.data
    assert manifest["built"] == "2026-12-01T10:00:00Z"
    assert manifest["built_durations_s"] == {"compile": 30.0, "total": 50.0}
    assert "team_index" in manifest["durations_s"] and "compile" not in manifest["durations_s"]
    assert (final / sbom.SBOM_FILE).read_bytes() == b'{"sbom": 1}\n'  # the build's own, kept
    assert SECRET not in "".join(p.read_text() for p in final.iterdir() if p.suffix == ".json")
    # the next build of these inputs is a local hit, the entry the build's own (no cache_source)
    local = WheelCache(tmp_path / "cache" / "wheels").lookup(KEY, tmp_path / "again")
    assert local is not None and local[0].read_bytes() == fake.data
    assert local[1]["cache_hit"] is False and "cache_source" not in local[1]
    assert local[2] == {sbom.SBOM_FILE: b'{"sbom": 1}\n', sbom.PROVENANCE_FILE: b'{"prov": 1}\n'}
    assert not (work / "team-index").exists()  # the download is gone, only the cache keeps it


def test_a_published_cache_hit_in_the_index_is_kept_as_the_build_it_republished(tmp_path):
    fake = Fake()
    b, plan, work = _builder(tmp_path, fake)

    def republished(key: str, landing: Path) -> RemoteHit | None:
        hit = fake(key, landing)
        assert hit is not None
        manifest = dict(
            hit.manifest,
            cache_hit=True,
            cache_source="http://elsewhere/",
            built="2026-11-30T09:00:00Z",
            built_durations_s={"compile": 99.0, "total": 120.0},
            created="2026-12-01T11:00:00Z",
        )
        return RemoteHit(hit.wheel, manifest, hit.documents, hit.source)

    b.remote = republished
    assert b._team_index_hit(KEY, plan, INTERP, work) is not None
    stored = json.loads((tmp_path / "cache/wheels" / KEY[:2] / KEY / "manifest.json").read_text())
    assert stored["cache_hit"] is False and "cache_source" not in stored
    assert stored["created"] == "2026-11-30T09:00:00Z"
    assert stored["durations_s"] == {"compile": 99.0, "total": 120.0}


@pytest.mark.parametrize(
    "fault, says",
    [
        ("raises", "team index lookup failed (RuntimeError"),
        ("other-python", "cannot install"),
        ("other-arch", "cannot install"),
        ("other-key", "another cache key"),
    ],
)
def test_a_failed_lookup_or_an_unfit_wheel_is_one_line_and_nothing_kept(
    tmp_path, capfd, fault, says
):
    fake = {
        "raises": Fake(raises=RuntimeError(f"boom at {INDEX}")),
        "other-python": Fake(name=wheelnames.fixture_wheel(py="cp310")),
        "other-arch": Fake(name=wheelnames.fixture_wheel(arch="aarch64")),
        "other-key": Fake(key="d" * 64),
    }[fault]
    b, plan, work = _builder(tmp_path, fake)
    assert b._team_index_hit(KEY, plan, INTERP, work) is None
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("!")]
    assert len(warnings) == 1 and says in warnings[0] and "compiling" in warnings[0]
    assert SECRET not in err
    assert not (tmp_path / "cache" / "wheels").exists() or not any(
        (tmp_path / "cache" / "wheels").rglob("*.whl")
    )
    assert not (work / "team-index").exists() and not (tmp_path / "dist").exists()


def test_a_miss_is_quiet(tmp_path, capfd):
    b, plan, work = _builder(tmp_path, Fake())
    b.remote = lambda key, landing: None
    assert b._team_index_hit(KEY, plan, INTERP, work) is None
    out = capfd.readouterr()
    assert not [line for line in (out.out + out.err).splitlines() if line.startswith("!")]


# --- the edge's real lookup (apexkit.index.remote) on a directory index `publish` wrote --------------------------


@pytest.fixture
def no_pip(monkeypatch):
    """remote.make_client without `pip config list` (a process): a client with no proxy, CA or login."""
    from apexkit.index import client, remote

    monkeypatch.setattr(
        remote,
        "make_client",
        lambda indexes, env, timeout=20.0: client.Client(client.IndexSettings(urls=(), origin="t")),
    )


def test_the_edge_lookup_fetches_verifies_and_the_builder_publishes_it(tmp_path, capfd, no_pip):
    from tests.unit.test_remote import KEY as PUBLISHED_KEY
    from tests.unit.test_remote import WHEEL as PUBLISHED_WHEEL
    from tests.unit.test_remote import published_index

    index = published_index(tmp_path / "pub")
    lookup = commands.team_index_lookup(resolve("--team-index", str(index)), env={})
    assert lookup is not None
    b, plan, work = _builder(tmp_path, Fake())
    b.remote = lookup
    hit = b._team_index_hit(PUBLISHED_KEY, plan, INTERP, work)
    assert hit is not None and hit[1] == index.as_uri()
    assert hit[0][0].read_bytes() == (index / "simple" / "apex" / PUBLISHED_WHEEL).read_bytes()
    assert (
        b._team_index_hit("0" * 64, plan, INTERP, work) is None
    )  # a key no wheel has: a quiet miss
    assert "!" not in capfd.readouterr().err


def test_the_edge_lookup_refuses_a_swapped_wheel_in_one_line(tmp_path, capfd, no_pip):
    from tests.unit.test_remote import KEY as PUBLISHED_KEY
    from tests.unit.test_remote import WHEEL as PUBLISHED_WHEEL
    from tests.unit.test_remote import published_index

    index = published_index(tmp_path / "pub")
    (index / "simple" / "apex" / PUBLISHED_WHEEL).write_bytes(
        _wheel_bytes()
    )  # other bytes, same name
    lookup = commands.team_index_lookup(resolve("--team-index", str(index)), env={})
    assert lookup is not None and lookup(PUBLISHED_KEY, tmp_path / "landing") is None
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("!")]
    assert len(lines) == 1 and "does not match the sha256" in lines[0] and "compiling" in lines[0]
    assert not list((tmp_path / "landing").rglob("*.whl"))  # nothing of it kept
