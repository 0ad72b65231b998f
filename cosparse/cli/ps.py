"""``cosparse ps serve`` and ``cosparse ps keygen``: the parameter server's command line (its
options, with their help text, and the runners that turn them into ``ServeOptions``)."""

from __future__ import annotations

import argparse
import json
import sys


def _ps_serve(args: argparse.Namespace) -> int:
    from cosparse.ps.server import ServeOptions, read_key_file, serve
    from cosparse.ps.shard import ShardLimits

    try:
        key = read_key_file(args.auth_key) if args.auth_key else None
    except (OSError, ValueError) as e:
        print(f"cosparse: error: --auth-key: {e}", file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in ("max_rows", "max_bytes", "max_request_rows", "max_dim",
                                           "max_tables") if getattr(args, k) is not None}
    try:
        limits = ShardLimits(**given)
    except ValueError as e:
        print(f"cosparse: error: {e}", file=sys.stderr)
        return 2
    opts = ServeOptions(
        shard=args.shard, num_shards=args.num_shards, bind=args.bind, data_dir=args.data_dir,
        config=args.config, auth_key=key, curve_secret=args.curve_secret, namespaces=args.namespaces,
        ready_file=args.ready_file, parent_pid=args.parent_pid, restore=args.restore,
        announce=args.announce, limits=limits, shard_threads=args.shard_threads,
    )
    if args.max_message_bytes is not None:
        opts.max_message_bytes = args.max_message_bytes
    opts.max_pending_bytes = args.max_pending_bytes
    opts.max_queued_reply_bytes = args.max_queued_reply_bytes
    opts.stall_timeout_s = args.stall_timeout_s
    return serve(opts)


def _ps_keygen(args: argparse.Namespace) -> int:
    from cosparse.ps.server import keygen

    try:
        paths = keygen(args.out)
    except (OSError, RuntimeError) as e:
        print(f"cosparse: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(paths, sort_keys=True))
    return 0


def add_ps_parser(sub: argparse._SubParsersAction) -> None:
    """The ``ps`` command and its ``serve`` and ``keygen`` subcommands."""
    ps = sub.add_parser("ps", help="parameter server: serve a shard, create keys")
    pss = ps.add_subparsers(dest="ps_command", required=True)
    s = pss.add_parser("serve", help="run one parameter-server shard")
    s.add_argument("--shard", type=int, required=True, help="this shard's index I")
    s.add_argument("--num-shards", type=int, required=True, help="N: shard I owns mix64(id) %% N == I")
    s.add_argument("--bind", default="127.0.0.1:0",
                   help="ADDR:PORT (default 127.0.0.1, port 0: a free one); non-loopback needs auth")
    s.add_argument("--data-dir", required=True, help="snapshots are written here and restored on start")
    s.add_argument("--config", default=None, help="YAML config whose `tables` the shard serves")
    auth = s.add_mutually_exclusive_group()
    auth.add_argument("--auth-key", default=None, help="file with a shared secret: HMAC-SHA256 per request")
    auth.add_argument("--curve-secret", default=None,
                      help="CURVE server secret key file (from `cosparse ps keygen`)")
    s.add_argument("--namespaces", default=None, metavar="FILE",
                   help="YAML: NAMESPACE: {key: FILE, quota: {rows, bytes}, readers: [...]}; "
                        "each namespace authenticates with its own HMAC key and touches only its "
                        "own tables (and reads those whose namespace lists it); quotas come from "
                        "here only. Without it the shard is one trust domain")
    s.add_argument("--ready-file", default=None, help="write the bound endpoint here once serving")
    s.add_argument("--parent-pid", type=int, default=None, help="exit when this parent process is gone")
    s.add_argument("--announce", default=None, metavar="HOST:PORT",
                   help="publish this shard's endpoint in torch.distributed's TCPStore there "
                        "(e.g. torchrun's MASTER_ADDR:MASTER_PORT) for trainers to discover")
    s.add_argument("--restore", default=None,
                   help="restore this snapshot of --data-dir (default: the newest), e.g. the one "
                        "a trainer checkpoint names")
    # limits (defaults: cosparse.ps.shard.ShardLimits and ps.server.DEFAULT_MAX_MESSAGE_BYTES)
    s.add_argument("--max-rows", type=int, default=None,
                   help="row budget: rows of all tables together (default 2^27); a request that "
                        "needs more new rows is refused, naming the shard")
    s.add_argument("--max-bytes", type=int, default=None,
                   help="byte budget: bytes of all tables' rows together, with their optimizer "
                        "state, versions and ID map (default: half the physical memory); a "
                        "REGISTER or a request that needs more is refused, naming the shard")
    s.add_argument("--max-request-rows", type=int, default=None,
                   help="IDs in one PULL/PUSH/PUSH_ROWS (default 2^20)")
    s.add_argument("--max-dim", type=int, default=None,
                   help="widest table a client may REGISTER (default 4096)")
    s.add_argument("--max-tables", type=int, default=None, help="tables on this shard (default 256)")
    s.add_argument("--max-message-bytes", type=int, default=None,
                   help="largest request and PULL reply, in bytes (default 256 MiB); request "
                        "bytes held for one connection never pass it: a connection whose "
                        "message would is dropped")
    s.add_argument("--max-pending-bytes", type=int, default=None,
                   help="request bytes held for all connections together (incomplete or "
                        "unanswered messages; default 4x --max-message-bytes); a connection "
                        "whose next frame would pass it is dropped")
    s.add_argument("--max-queued-reply-bytes", type=int, default=None,
                   help="reply bytes queued for one connection (default --max-message-bytes); "
                        "past it, that connection's requests wait until its client reads")
    s.add_argument("--stall-timeout-s", type=float, default=60.0,
                   help="drop a connection whose reply queue stays over "
                        "--max-queued-reply-bytes, or whose incomplete message gets no byte, "
                        "for this long (default 60)")
    s.add_argument("--shard-threads", type=int, default=1,
                   help="threads of each PULL/PUSH (default 1); each row is still updated by one "
                        "thread, in request order, so results do not depend on it (at most "
                        "NUMBA_NUM_THREADS)")
    s.set_defaults(func=_ps_serve)
    k = pss.add_parser("keygen", help="create CURVE key pairs and an HMAC secret")
    k.add_argument("--out", required=True, help="directory for the keys")
    k.set_defaults(func=_ps_keygen)
