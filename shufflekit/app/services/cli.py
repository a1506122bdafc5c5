"""`shufflekit keys new`, `shufflekit serve mix|analyzer|coordinator`, `shufflekit clients`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, count, refuse
from shufflekit.app.render import print_json

if TYPE_CHECKING:  # the services (pydantic, cryptography, MQTT) are imported when a command runs
    import asyncio

    from shufflekit.app.services.config import ServiceConfig
    from shufflekit.app.services.keys import DerivedKey

keys_app = typer.Typer(
    help="Key pairs of the mixes and the analyzer (HPKE) and of the enrollment authority "
    "(Ed25519, issues client credentials)."
)
serve_app = typer.Typer(
    help="Run a role as a long-running service over MQTT (stop with SIGTERM or Ctrl-C).",
    no_args_is_help=True,
)

ConfigOpt = Annotated[
    Path,
    typer.Option(
        "--config",
        help="Service configuration (TOML); examples in the repository's deploy/examples/.",
    ),
]
LogOpt = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]


@keys_app.command("new")
def keys_new(
    role: Annotated[str, typer.Option("--role", help="mix, analyzer or enrollment.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for ROLE.key and ROLE.pub.")],
    index: Annotated[
        int | None, typer.Option("--index", min=0, max=15, help="Which mix (mixes only).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key pair.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a role's key pair: ROLE.key (private, mode 0600) and ROLE.pub (public).

    The mix files are named mix0, mix1, ...; the coordinator's config points at the .pub files.
    Mix 0 and the analyzer derive a signing key from theirs, whose public half goes next to
    ROLE.pub: mix0.receipt.pub (receipts) and analyzer.result.pub (results).
    `enrollment` is the operator's credential authority: mix 0's `\\[mix] enrollment_key` is its
    .pub file; its .key file enrols clients (`keys enroll`, `clients --enrollment-key`).
    """
    from shufflekit.app.services.keys import (
        KeyFiles,
        derived_of,
        role_name,
        write_enrollment_key,
        write_key_pair,
    )

    name = role_name(role, index)
    files = KeyFiles.of(out, name)
    key = (
        write_enrollment_key(files, force=force)
        if role == "enrollment"
        else write_key_pair(files, force=force)
    )
    info = {
        "role": role,
        "index": index,
        "name": name,
        "public_key": key.public_b64(),
        "private_key_file": str(files.private),
        "public_key_file": str(files.public),
        "derived_public_key_files": [str(kind.file(files.public)) for kind in derived_of(files)],
    }
    if json_out:
        print_json(info)
    else:
        also = "".join(
            f"\n{kind.what}: public key {kind.file(files.public)}" for kind in derived_of(files)
        )
        render.console.print(
            f"{name}: private key {files.private} (mode 600), public key {files.public}\n"
            f"public key: {info['public_key']}{also}",
            soft_wrap=True,  # a key is never split across lines, even on a narrow terminal
        )


@keys_app.command("result-key")
def keys_result_key(
    key: Annotated[Path, typer.Option("--key", help="The analyzer's private key file.")],
    json_out: JsonOpt = False,
) -> None:
    """Write the analyzer's result public key (analyzer.result.pub) from its private key.

    The analyzer signs every result with a key derived from its own; the coordinator and
    anyone reading results check it against this file. `keys new --role analyzer` writes it
    too; this is for a key made before results were signed.
    """
    from shufflekit.app.services.keys import RESULT_KEY

    _write_derived(RESULT_KEY, key, json_out)


@keys_app.command("enroll")
def keys_enroll(
    key: Annotated[Path, typer.Option("--key", help="The enrollment private key file.")],
    deployment: Annotated[str, typer.Option("--deployment", help="Deployment name.")],
    client_id: Annotated[
        list[str], typer.Option("--client-id", help="Client id to enrol (repeatable).")
    ],
    json_out: JsonOpt = False,
) -> None:
    """Enrol clients: print each client id and its credential, one `ID CREDENTIAL` per line.

    Lines are never wrapped (safe to redirect); --json prints one object instead.

    A credential is the client's own key with its certificate: keep it secret on the client.

    Each report carries the client's signature for that round; mix 0 counts one per client.
    """
    import base64

    from shufflekit.app.services.keys import load_enrollment_key

    authority = load_enrollment_key(key)
    creds = {
        cid: base64.b64encode(authority.issue(deployment, cid).to_bytes()).decode()
        for cid in client_id
    }
    if json_out:
        print_json({"deployment": deployment, "credentials": creds})
    else:
        for cid, cred in creds.items():
            typer.echo(f"{cid} {cred}")  # plain: no wrapping, no styling, whatever the width


@keys_app.command("receipt")
def keys_receipt(
    key: Annotated[Path, typer.Option("--key", help="Mix 0's private key file (mix0.key).")],
    json_out: JsonOpt = False,
) -> None:
    """Write mix 0's receipt public key next to its key: mix0.receipt.pub (derived from it).

    `keys new --role mix --index 0` writes it too; this is for a mix 0 key made before
    receipts. The coordinator announces it, and clients check mix 0's receipts with it.
    """
    from shufflekit.app.services.keys import RECEIPT_KEY

    _write_derived(RECEIPT_KEY, key, json_out)


def _write_derived(kind: DerivedKey, key: Path, json_out: bool) -> None:
    """Write `kind`'s public half next to the hop's key file `key` (checked to be that hop's)."""
    from shufflekit.app.services.keys import load_private_key, write_derived_public

    pair = load_private_key(key, kind.hop)
    public = key.with_name(key.name.removesuffix(".key") + ".pub")
    path = write_derived_public(kind, public, pair.private_b64())
    text = kind.public_of(pair.private_b64())
    if json_out:
        print_json({f"{kind.purpose}_key": text, f"{kind.purpose}_key_file": str(path)})
    else:
        render.console.print(f"{kind.what} {text} written to {path}", highlight=False)


class OneLineFormatter(logging.Formatter):
    """A service's log lines: an exception logged with its traceback (ours, or a library's,
    such as aiomqtt's on a second SIGTERM) shows on the same line as its type and message,
    unless `--log-level debug` or SHUFFLEKIT_DEBUG=1 asks for the traceback."""

    def __init__(self, fmt: str, tracebacks: bool) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks or not record.exc_info:
            return super().format(record)
        exc = record.exc_info[1]
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        said = " ".join(str(exc).split())
        return f"{line} ({type(exc).__name__}{': ' + said if said else ''})"


def _setup(config: Path, log_level: str) -> ServiceConfig:
    from shufflekit.app.services.config import load_config

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        refuse(f"unknown --log-level {log_level!r}")
    handler = logging.StreamHandler()
    tracebacks = level <= logging.DEBUG or bool(os.environ.get("SHUFFLEKIT_DEBUG"))
    handler.setFormatter(
        OneLineFormatter("%(asctime)s %(name)s %(levelname)s %(message)s", tracebacks)
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return load_config(config)


def _run(main: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> None:
    from shufflekit.app.services.runtime import run_service

    code = run_service(main)
    raise SystemExit(code)


@serve_app.command("mix")
def serve_mix_cmd(
    config: ConfigOpt,
    index: Annotated[
        int | None, typer.Option("--index", min=0, help="Which mix (default: \\[mix] index).")
    ] = None,
    log_level: LogOpt = "info",
) -> None:
    """Mix I of the cascade: ingest (mix 0) or receive; peel, permute, forward; every round."""
    from shufflekit.app.services.runtime import serve_mix

    cfg = _setup(config, log_level)
    _run(lambda stop: serve_mix(cfg, index, stop))


@serve_app.command("analyzer")
def serve_analyzer_cmd(config: ConfigOpt, log_level: LogOpt = "info") -> None:
    """The analyzer: decrypt, count, commit the cost in the ledger, then publish the result."""
    from shufflekit.app.services.runtime import serve_analyzer

    cfg = _setup(config, log_level)
    _run(lambda stop: serve_analyzer(cfg, stop))


@serve_app.command("coordinator")
def serve_coordinator_cmd(
    config: ConfigOpt,
    rounds: Annotated[
        int | None,
        typer.Option("--rounds", min=1, help="Run R rounds, then exit (default: run on)."),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option("--interval", min=0.0, help="Seconds between rounds (default: config)."),
    ] = None,
    log_level: LogOpt = "info",
) -> None:
    """The coordinator: reserve each round's cost, announce it, settle it (commit or refund).

    Prints one JSON object per round on stdout. SIGTERM closes the current round early (it is
    released if it reached n_min, aborted and refunded otherwise), then exits 0.
    """
    from shufflekit.app.services.runtime import serve_coordinator

    cfg = _setup(config, log_level)
    _run(lambda stop: serve_coordinator(cfg, stop, rounds=rounds, interval=interval))


def clients(
    broker: Annotated[
        str,
        typer.Option(
            "--broker",
            help="mqtt://host:port or mqtts://user@host:port (password, CA and client "
            "certificate from SHUFFLEKIT_MQTT_PASSWORD, _CA_FILE, _CERT_FILE, _KEY_FILE).",
        ),
    ],
    deployment: Annotated[str, typer.Option("--deployment", help="Deployment name.")],
    users: Annotated[int, typer.Option("--users", parser=count, help="Simulated clients.")],
    bad_fraction: Annotated[
        float, typer.Option("--bad-fraction", min=0.0, max=1.0, help="Share of malformed reports.")
    ] = 0.0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of values and bad clients.")] = 0,
    connections: Annotated[
        int, typer.Option("--connections", min=1, max=64, help="Broker connections to use.")
    ] = 4,
    wait: Annotated[
        float, typer.Option("--wait", min=0.0, help="Seconds to wait for an open round.")
    ] = 60.0,
    id_prefix: Annotated[str, typer.Option("--id-prefix", help="Client ids: PREFIX-i.")] = "sim",
    enrollment_key: Annotated[
        Path | None,
        typer.Option(
            "--enrollment-key",
            help="Enrol each client with this enrollment private key and send its credential "
            "(needed when mix 0 checks credentials).",
        ),
    ] = None,
    receipts: Annotated[
        bool,
        typer.Option(
            "--receipts",
            help="Resend each report until mix 0's signed receipt arrives (else: until the "
            "broker's PUBACK); reports how many are receipted.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Simulated clients answer the deployment's current round (k-RR + onion), F of them badly."""
    import asyncio

    from shufflekit.app.services.clients import ClientsSummary, run_clients
    from shufflekit.app.services.keys import load_enrollment_key

    if users < 1:
        refuse(f"--users must be at least 1, got {users}")

    authority = load_enrollment_key(enrollment_key) if enrollment_key else None

    def run(progress: Callable[[str], None]) -> ClientsSummary:
        return asyncio.run(
            run_clients(
                broker,
                deployment,
                users,
                bad_fraction=bad_fraction,
                seed=seed,
                connections=connections,
                wait=wait,
                id_prefix=id_prefix,
                enrollment=authority,
                receipts=receipts,
                progress=progress,
            )
        )

    if not json_out and render.err_console.is_terminal:  # what it waits for, on a terminal only
        with render.err_console.status("starting") as status:
            summary = run(lambda s: status.update(s, spinner="dots"))
    else:
        summary = run(lambda _s: None)
    out = summary.as_dict()
    if json_out:
        print_json(out)
    else:
        render.console.print(
            f"round {summary.round_id}: sent {summary.sent} reports ({out['good']} good, "
            f"{summary.bad} malformed {summary.bad_by_kind}), "
            + (
                "acknowledged by the broker (no receipts asked: --receipts)"
                if summary.receipted is None
                else f"{summary.receipted} receipted by mix 0"
            )
            + f", in {summary.seconds:.1f}s; "
            f"{summary.seconds_left_at_end:.0f}s left before the deadline",
            highlight=False,
        )
