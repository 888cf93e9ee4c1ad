"""A matrix combination reaches the build as typed options (nox -s build-<combo>), not as a command line parsed
again; another process (a local matrix run's child, a Slurm job) is given the same options as JSON
(`apexkit build 3.X --options-json FILE`), resolved once by its parent."""

from __future__ import annotations

import json
import os

import pytest

from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun
from apexkit.plan import matrix
from apexkit.wheel import options


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def _child_reads(opts: options.BuildOptions, tmp_path) -> options.BuildOptions:
    """What the child `apexkit build 3.X --options-json FILE` builds, FILE written as a matrix run writes it."""
    path = tmp_path / "options.json"
    path.write_bytes(options.child_json(opts))
    return options.resolve(opts.python, ["--options-json", str(path)], env={})


def test_a_combination_is_the_same_build_typed_or_as_its_childs_options_file(m, tmp_path):
    combos = m.combinations(
        [
            {"python": "3.11", "torch": "2.13.0", "arch": "x86_64"},
            {
                "python": "3.11",
                "torch": "2.7.1",
                "torch_npu": "2.7.1.post8",
                "arch": "x86_64",
                "ref": "v2.7.1",
            },
            {"python": "3.11", "torch": "2.13.0", "arch": "aarch64"},  # in its builder image
        ]
    )
    run = {"dist": tmp_path / "dist", "jobs": 3}
    for combo in combos:
        typed = matrixrun.resolve_cell(m, combo, ["--dry-run"], run, host="x86_64")
        assert typed.torch == combo.torch and typed.torch_npu == combo.torch_npu
        assert typed.jobs == 3 and typed.dist_dir == tmp_path / "dist"
        assert _child_reads(typed, tmp_path) == typed
    assert typed.image == matrixrun.build_options(m, combos[2], host="x86_64")["image"]


def test_a_childs_options_may_name_what_only_a_host_does_and_a_containers_may_not(m, tmp_path):
    """The child on a host may start a container itself (a foreign arch's image), use an interpreter and build
    for CUDA; a container's options file (no on_host) still refuses them."""
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "aarch64"}])[0]
    argv = ["--interpreter", "/usr/bin/python3.11", "--dry-run"]
    foreign = matrixrun.resolve_cell(m, combo, ["--dry-run"], {}, host="x86_64")
    cuda = options.resolve("3.11", ["--backend", "cuda", "--cuda-arch", "8.0", *argv], env={})
    for opts in (foreign, cuda):
        assert _child_reads(opts, tmp_path) == opts
    container = json.loads(options.child_json(foreign))
    del container[options.ON_HOST]
    with pytest.raises(ConfigError, match="image cannot be set inside a container build"):
        options.from_json(container, "3.11")


def test_the_compile_jobs_of_a_slurm_job_are_the_nodes_unless_the_flags_say(
    m, tmp_path, monkeypatch
):
    """--parallel is the cells at a time; a cell's compile jobs are a field of its options: on Slurm left to the
    node (null in the file: $APEXKIT_JOBS, which the batch script sets from the job's CPUs), -- --jobs N wins."""
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    run = {"jobs": options.THEIR_JOBS}
    node = matrixrun.resolve_cell(m, combo, ["--dry-run"], run, host="x86_64")
    assert json.loads(options.child_json(node))["jobs"] is None
    monkeypatch.setenv("APEXKIT_JOBS", "7")
    assert _child_reads(node, tmp_path).jobs == 7
    monkeypatch.delenv("APEXKIT_JOBS")
    assert _child_reads(node, tmp_path).jobs == (os.cpu_count() or 1)
    asked = matrixrun.resolve_cell(m, combo, ["--dry-run", "--jobs", "2"], run, host="x86_64")
    assert json.loads(options.child_json(asked))["jobs"] == 2


def test_an_options_file_is_read_as_untrusted_input(m, tmp_path):
    """A Slurm job's file lies on shared storage: a link is not followed, a huge file not read; one line each."""
    opts = options.resolve("3.11", ["--dry-run"], env={})
    real = tmp_path / "real.json"
    real.write_bytes(options.child_json(opts))
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(ConfigError, match="--options-json: .*symbolic link"):
        options.load_json(tmp_path / "link.json", "3.11")
    real.write_bytes(b" " * (options.MAX_JSON_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        options.load_json(real, "3.11")


def test_the_command_line_still_overrides_and_contradictions_are_one_line(m, tmp_path):
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    given = matrixrun.build_options(m, combo, host="x86_64")
    assert options.resolve("3.11", ["--torch", "2.12.0"], env={}, given=given).torch == "2.12.0"
    with pytest.raises(ConfigError, match="contradict each other"):
        options.resolve("3.11", ["--use-system-torch"], env={}, given=given)
    with pytest.raises(ConfigError, match="unknown build option"):
        options.resolve("3.11", [], env={}, given={"torhc": "2.13.0"})


def test_options_json_does_not_silently_drop_a_combinations_given_options(m, tmp_path):
    """--options-json carries a whole build (a container's): with a combination's typed options (nox -s
    build-<combo> -- --options-json F) it would build what F says under the combination's name."""
    import json

    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    other = options.resolve("3.11", ["--torch", "2.12.0", "--dry-run"], env={})
    path = tmp_path / "options.json"
    path.write_text(json.dumps({**options.to_json(other), "python_path": None}))
    assert options.resolve("3.11", ["--options-json", str(path)], env={}).torch == "2.12.0"
    with pytest.raises(ConfigError, match="--options-json"):
        options.resolve(
            "3.11",
            ["--options-json", str(path)],
            env={},
            given=matrixrun.build_options(m, combo, host="x86_64"),
        )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("backend", "rocm", "backend must be one of ascend, cuda"),
        ("sanitize", ["bogus"], "sanitize among address, undefined"),
        ("cuda_ext", ["a;rm -rf /"], "is not an extension name"),
    ],
)
def test_a_hosts_options_file_is_checked_like_the_flags_it_stands_for(field, value, says):
    """A matrix or Slurm child's file (on_host) may name an image or a CUDA build, but its values are still those a
    flag could give: an unknown backend or sanitizer, or a word that is no extension name, is one line."""
    with pytest.raises(ConfigError, match=says):
        options.from_json({"python": "3.11", options.ON_HOST: True, field: value}, "3.11")
