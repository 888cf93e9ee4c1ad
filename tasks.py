"""apexkit invoke tasks. `invoke --list` lists them; `invoke --help <task>` explains one.

build         build a wheel (same options as `nox -s build-<python> --`): invoke build --python 3.11 -- --torch 2.13.0
              inside a builder image: invoke build --image apexkit/builder:debian-bookworm-x86_64 -- <options>
proxy.setup   proxy (+ CA, mirrors) for the shell, the Docker daemon and containers; --dry-run shows the diffs
proxy.check   per layer: configured? effective? a real request through the proxy
proxy.show    what is saved and what each layer's files hold (passwords masked)
proxy.env     export lines for eval "$(invoke proxy.env)"
proxy.remove  undo setup (files restored from backups; your own content untouched)
image.build      builder image from a base (its package manager, non-root user, CA hook); x86_64 or aarch64
image.list       apexkit images (stale ones marked)
image.prune      remove stale/untagged apexkit images (--all: every one)
image.emulation  can this host run x86_64/aarch64 containers (QEMU binfmt)? --enable registers it
publish          dist/ -> PEP 503 simple index (pip install apex --index-url file:///…/index/simple/)
doctor           check this machine (each check: status + fix); --log FILE explains a failed build; --json
fleet.submit     validate (+ benchmark) a published wheel on every node of a Slurm cluster; --dry-run prints the script
fleet.status     the fleet's jobs and where each node is
fleet.report     one row per node (chip, driver, CANN, torch, sha256, verdict, step time vs median); exit 1 on a gap
"""


import shlex
import sys
from pathlib import Path

from invoke import Collection, Exit, task

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apexkit import log, vocab
from apexkit.errors import ApexkitError


@task(help={"python": "target Python, e.g. 3.11 (default: 3.11)",
            "options": 'build options in one string, as for nox -s build-3.X -- (e.g. "--torch 2.13.0 --jobs 2"; '
                       '"--help" lists them); options after a bare -- work too',
            "image": "build inside this builder image (invoke image.build makes one); the wheel lands in dist/"},
      positional=[], auto_shortflags=False)
def build(c, python="3.11", options="", image=None):
    """Build the Apex for Ascend wheel for one Python into dist/: invoke build [--image IMAGE] -- <build options>."""
    from apexkit.build import builder as apexkit_build

    argv = shlex.split(options) + shlex.split(c.remainder or "") + (["--image", image] if image else [])
    def one() -> int:
        apexkit_build.main(python, argv, prog=f"invoke build --python {python} --")
        return 0

    _run(one)


def _run(func, *args, **kwargs) -> None:
    """An ApexkitError is one `error:` line and its exit code; $APEXKIT_STATUS_FILE gets the code either way."""
    from apexkit.cli import record_status

    try:
        code = func(*args, **kwargs)
    except ApexkitError as exc:
        record_status(exc.exit_code, exc.format())
        raise Exit(f"error: {log.mask(exc.format())}", code=exc.exit_code) from None
    record_status(code or 0)
    if code:
        raise Exit(code=code)


_PATH_HELP = {
    "profile": "shell file for the block (default ~/.bashrc; with --system /etc/profile.d/apexkit-proxy.sh)",
    "system": "system-wide files: /etc/profile.d/apexkit-proxy.sh and /etc/pip.conf",
    "root": "prefix for every path written or read (a test root standing for /); nothing is restarted",
}


@task(help={
    "http": "proxy for http:// URLs, e.g. http://user:password@proxy:3128 (default: $http_proxy/$HTTP_PROXY)",
    "https": "proxy for https:// URLs (default: $https_proxy/$HTTPS_PROXY, else --http)",
    "no-proxy": "extra hosts/domains/CIDRs that bypass the proxy; localhost,127.0.0.0/8,::1 are always added",
    "ca-cert": "PEM file of a TLS-intercepting proxy's CA: a bundle (system CAs + it) is exported as SSL_CERT_FILE, "
               "REQUESTS_CA_BUNDLE, PIP_CERT, GIT_SSL_CAINFO, CURL_CA_BUNDLE",
    "pip-index": "pip index mirror written to pip.conf (the no-proxy path)",
    "registry-mirror": "registry mirror for the Docker daemon (daemon.json registry-mirrors); repeat for several",
    "layers": "comma-separated layers to touch: shell,daemon,container,pip (default: all)",
    "only": "deprecated spelling of --layers",
    "daemon-mode": "auto (from the engine version), systemd (drop-ins) or daemon-json (Docker >= 23)",
    "dry-run": "print the unified diff of every file; write nothing",
    "restart": "restart the Docker daemon under systemd after a daemon change (--no-restart: print the commands)",
    **_PATH_HELP,
}, iterable=["registry_mirror"], auto_shortflags=False)
def setup(c, http=None, https=None, no_proxy=None, ca_cert=None, pip_index=None, registry_mirror=None, layers=None,
          only=None, profile=None, system=False, daemon_mode="auto", root=None, dry_run=False, restart=True):
    """Configure the proxy in all three layers (shell, Docker daemon, containers) plus mirrors and a CA."""
    from apexkit.proxy import cli as proxycli

    _run(lambda: proxycli.setup(
        http=http, https=https, no_proxy=no_proxy, ca_cert=ca_cert, pip_index=pip_index,
        registry_mirror=registry_mirror or [], only=_layers(layers, only), profile=profile, system=system,
        daemon_mode=daemon_mode, root=root, dry_run=dry_run, restart=restart))


@task(help={"index-url": "URL for the HTTPS probe (default: the pip mirror, $PIP_INDEX_URL, else https://pypi.org/simple/)",
            "image": "local image for the container probe (needs bash; default: the first apexkit/* image)",
            "layers": "comma-separated layers: shell,daemon,container", "only": "deprecated spelling of --layers",
            "json": "print JSON on stdout", **_PATH_HELP},
      auto_shortflags=False)
def check(c, index_url=None, image=None, layers=None, only=None, json=False, profile=None, system=False, root=None):
    """Check every layer: configured? effective? a real request through the proxy. Exit 1 when one fails."""
    from apexkit.proxy import cli as proxycli

    _run(lambda: proxycli.check(profile=profile, system=system, root=root, index_url=index_url, image=image,
                                only=_layers(layers, only), as_json=json))


@task(help={"json": "print JSON on stdout", **_PATH_HELP}, auto_shortflags=False)
def show(c, json=False, profile=None, system=False, root=None):
    """Show the saved settings and what each layer's files hold (passwords masked)."""
    from apexkit.proxy import cli as proxycli

    _run(proxycli.show, profile=profile, system=system, root=root, as_json=json)


@task(help={"reveal": "print passwords even on a terminal", "unset": "print unset lines instead", **_PATH_HELP},
      auto_shortflags=False)
def env(c, reveal=False, unset=False, profile=None, system=False, root=None):
    """Print export lines for the current shell: eval "$(invoke proxy.env)"."""
    from apexkit.proxy import cli as proxycli

    _run(proxycli.env, profile=profile, system=system, root=root, reveal=reveal, unset=unset)


@task(help={"layers": "comma-separated layers to undo (default: all)", "only": "deprecated spelling of --layers",
            "dry-run": "print the diffs; write nothing",
            **_PATH_HELP}, auto_shortflags=False)
def remove(c, layers=None, only=None, dry_run=False, profile=None, system=False, root=None):
    """Undo proxy.setup: files restored from backups, your own content byte-identical."""
    from apexkit.proxy import cli as proxycli

    _run(lambda: proxycli.remove(only=_layers(layers, only), profile=profile, system=system, root=root,
                                 dry_run=dry_run))


def _layers(layers, only):
    return vocab.pick(layers, only, "--only LIST", "--layers LIST")


proxy_ns = Collection("proxy", setup, check, show, env, remove)


# --- image.* ---------------------------------------------------------------------------------------------------------

@task(name="build", help={
    "arch": "x86_64 or aarch64 (amd64/arm64 accepted); a foreign arch runs through QEMU binfmt (image.emulation)",
    "base": "base image: a local or pullable reference (openeuler/openeuler:22.03, ubuntu:22.04, a MindIE image), "
            "or debootstrap[:suite] to make a Debian base here without a registry",
    "tag": "image name (default apexkit/builder:<base>-<arch>)",
    "network": "network for RUN steps, e.g. host (automatic when the proxy listens on this host's loopback)",
    "ca-cert": "PEM file of CA certificates to trust besides the base's (a TLS-intercepting proxy's CA), or 'none' "
               "(default: proxy.setup's bundle, else $SSL_CERT_FILE)",
    "ca-bundle": "deprecated spelling of --ca-cert",
    "extra-packages": "more distro packages, space separated (e.g. 'python3.9 python3.9-devel')",
    "uid": "uid of the non-root build user (default 1000)", "gid": "its gid (default 1000)",
    "pip-index": "credential-free index for the tool venv (default: proxy.setup's mirror, else $PIP_INDEX_URL)",
    "no-cache": "rebuild every layer", "dry-run": "print the plan; make, pull and build nothing",
    "quiet": "only the step lines, not every line of output",
    "pythons": "more Pythons, e.g. 3.8,3.10: those the base lacks are installed with uv (python-build-standalone "
               "from github.com, through the proxy and CA); builder.json lists each Python and where it came from",
}, auto_shortflags=False)
def image_build(c, arch, base, tag=None, network=None, ca_cert=None, ca_bundle=None, extra_packages="", uid=1000, gid=1000,
                pip_index=None, no_cache=False, dry_run=False, quiet=False, pythons=""):
    """Build a builder image: the base + toolchain (its own package manager), tool venv, non-root user, CA hook."""
    from apexkit.images import cli as imagecli

    _run(lambda: imagecli.build(
        arch=arch, base=base, tag=tag, network=network,
        ca_bundle=vocab.pick(ca_cert, ca_bundle, "--ca-bundle FILE", "--ca-cert FILE"),
        extra_packages=extra_packages, uid=int(uid), gid=int(gid), pip_index=pip_index, no_cache=no_cache,
        dry_run=dry_run, quiet=quiet, pythons=pythons))


@task(name="list", help={"json": "print JSON on stdout"}, auto_shortflags=False)
def image_list(c, json=False):
    """List apexkit builder and base images (stale ones: docker/ changed since they were built)."""
    from apexkit.images import cli as imagecli

    _run(imagecli.list_images, as_json=json)


@task(name="prune", help={"all": "remove every apexkit image, not only stale and untagged ones",
                          "dry-run": "print what would be removed"}, auto_shortflags=False)
def image_prune(c, all=False, dry_run=False):
    """Remove stale builder images (docker/ changed since) and untagged ones; --all: every apexkit image."""
    from apexkit.images import cli as imagecli

    _run(imagecli.prune, everything=all, dry_run=dry_run)


@task(name="emulation", help={"arch": "one architecture (default: all)", "enable": "register QEMU for it (root)",
                              "dry-run": "with --enable: print the commands", "json": "print JSON on stdout"},
      auto_shortflags=False)
def image_emulation(c, arch=None, enable=False, dry_run=False, json=False):
    """Can this host run x86_64/aarch64 containers (natively or via QEMU binfmt)? Exit 1 when not; --enable fixes it."""
    from apexkit.images import cli as imagecli

    _run(imagecli.emulation, arch=arch, enable=enable, dry_run=dry_run, as_json=json)


image_ns = Collection("image", image_build, image_list, image_prune, image_emulation)


@task(help={"json": "print JSON on stdout (for CI)",
            "log": "a failed build's log: name the known failures in it (cause and fix) instead of checking the machine",
            "venv": "the training environment (venv/conda dir): does it need Apex for Ascend at all? (MindSpeed >= 2.2: no)",
            "interpreter": "the training environment's interpreter (instead of --venv): does it need Apex for Ascend?",
            "python": "deprecated spelling of --interpreter",
            "scripts": "training scripts (dir or file) to scan for amp.initialize/combine_grad/apex.optimizers.NpuFused*"},
      auto_shortflags=False)
def doctor(c, json=False, log=None, venv=None, interpreter=None, python=None, scripts=None):
    """Check this machine for building Apex for Ascend (interpreters, compiler, torch, CANN, Docker, QEMU, disk,
    proxy, CA) and whether the training stack needs apex at all: each check with its status and the fix.
    Exit 1 when one fails."""
    from apexkit.doctor import cli as doctorcli

    _run(lambda: doctorcli.main(log_file=log, as_json=json, venv=venv, scripts=scripts,
                                python=vocab.pick(interpreter, python, "--python PATH", "--interpreter PATH")))


@task(help={"dist": "built targets (default: $APEXKIT_DIST_DIR, else ./dist)",
            "index": "index directory to write (default ./index)",
            "target": "only this dist/<target-id> (repeat for several)",
            "split-by-torch": "one index per torch version (<index>/torch<version>/simple/): the wheel name does not "
                              "carry the torch it was built against",
            "dry-run": "print what would be published"}, iterable=["target"], auto_shortflags=False)
def publish(c, dist=None, index="index", target=None, split_by_torch=False, dry_run=False):
    """Turn dist/ into a PEP 503 simple index: pip install apex --index-url file:///…/index/simple/."""
    import os

    from apexkit.matrix import model as matrix
    from apexkit.matrix import publish as publish_mod

    dist_dir = Path(dist or os.environ.get("APEXKIT_DIST_DIR") or matrix.PROJECT_ROOT / "dist")
    _run(lambda: publish_mod.publish(dist_dir, Path(index), target or None, split_by_torch, dry_run) and 0)


ns = Collection(build, proxy_ns, image_ns, doctor, publish)


# --- fleet.* ---------------------------------------------------------------------------------------------------------

@task(name="submit", help={
    "index": "the wheel index (invoke publish --index output) on shared storage, or its http(s) URL",
    "results": "shared results directory the nodes write <node>.json into (default ./fleet-results)",
    "target": "the index's target to validate (default: its only one)",
    "stack": "a matrix.toml [stacks] name: its build in the index (torch_npu from the stack)",
    "device": "what each node must be ready for: npu (default), cuda or cpu",
    "partition": "Slurm partition (sbatch --partition)",
    "nodes": "number of nodes (sbatch --nodes); one srun step runs on each",
    "nodelist": "these nodes, comma separated (sbatch --nodelist)",
    "gres": "generic resources per node, passed through (e.g. npu:8)",
    "account": "Slurm account, passed through",
    "time-limit": "job time limit (sbatch --time, default 01:00:00)",
    "bench": "also run a short bench/amp_bench.py (mlp, fp32) on each node: step time vs the fleet median",
    "bench-args": "more amp_bench.py arguments (implies --bench), e.g. '--scale 0.05'",
    "find-links": "wheelhouse the nodes' pip reads for torch/torch_npu (repeat for several)",
    "torch-index-url": "index the nodes install torch from (e.g. https://download.pytorch.org/whl/cpu)",
    "extra-index-url": "extra index for torch/torch_npu (repeat for several)",
    "node-interpreter": "interpreter on the nodes (default python3.X of the target)",
    "node-python": "deprecated spelling of --node-interpreter",
    "node-dir": "node-local scratch for the venvs (default ${TMPDIR:-/tmp}/apexkit-fleet)",
    "set-env": "CANN set_env.sh files to try on the nodes, comma separated (default the toolkit's)",
    "keep-venv": "keep each node's venv after the run",
    "resume": "resubmit only the nodes of --results that have no result (same options as before)",
    "dry-run": "print the batch script; submit nothing",
}, iterable=["find_links", "extra_index_url"], auto_shortflags=False)
def fleet_submit(c, index=None, results="fleet-results", target=None, stack=None, device="npu", partition=None,
                 nodes=None, nodelist=None, gres=None, account=None, time_limit="01:00:00", bench=False,
                 bench_args=None, find_links=None, torch_index_url=None, extra_index_url=None, node_interpreter=None,
                 node_python=None, node_dir=None, set_env=None, keep_venv=False, resume=False, dry_run=False):
    """Validate (and benchmark) the wheel on every node through Slurm: one allocation, one srun step per node."""
    from apexkit.validate import fleet

    def one() -> int:
        if resume and index is None:
            plan = fleet.stored_plan(results)
        else:
            if index is None:
                raise fleet.ConfigError("--index is required", "pass the directory invoke publish wrote, or its URL")
            plan = fleet.make_plan(results=results, index=index, target=target, stack=stack, device=device,
                                   partition=partition, nodes=int(nodes) if nodes else None, nodelist=nodelist,
                                   gres=gres, account=account, time_limit=time_limit, bench=bench,
                                   bench_args=bench_args, find_links=find_links, torch_index_url=torch_index_url,
                                   extra_index_url=extra_index_url, node_dir=node_dir,
                                   node_python=vocab.pick(node_interpreter, node_python, "--node-python PATH",
                                                          "--node-interpreter PATH"),
                                   set_env=set_env, keep_venv=keep_venv, resume=resume)
        fleet.submit(plan, dry_run=dry_run, resume=resume)
        return 0

    _run(one)


@task(name="status", help={"results": "the results directory of fleet.submit", "json": "print JSON on stdout"},
      auto_shortflags=False)
def fleet_status(c, results, json=False):
    """The fleet's Slurm jobs (squeue/scontrol/sacct) and the stage each node is at."""
    from apexkit.validate import fleet

    _run(fleet.status, Path(results), as_json=json)


@task(name="report", help={"results": "the results directory of fleet.submit", "json": "print JSON on stdout",
                           "threshold": "flag step times further than this fraction from the median (default 0.10)"},
      auto_shortflags=False)
def fleet_report(c, results, json=False, threshold=None):
    """One row per node: chip, driver, CANN, torch, torch_npu, wheel sha256, verdict, step time vs the median, first
    failing check + fix. Exit 1 when a node failed, died or did not report."""
    from apexkit.validate import fleet

    _run(fleet.report, Path(results), as_json=json,
         threshold=float(threshold) if threshold is not None else fleet.DEFAULT_THRESHOLD)


fleet_ns = Collection("fleet", fleet_submit, fleet_status, fleet_report)
ns.add_collection(fleet_ns)
