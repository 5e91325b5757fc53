"""python -m client "prompt" [--host H] [--port P] [--protocol grpc|http] [sampling options]

Prints tokens as they arrive, then a summary line on stderr.
"""
import argparse
import asyncio
import sys
from dataclasses import Field
from pathlib import Path

from contract import field_type, item_type, request_fields

from . import StreamError, default_port, stream


def add_option(parser: argparse.ArgumentParser, f: Field) -> None:
    flag, (kind, _) = "--" + f.name.replace("_", "-"), field_type(f)
    help_text = f.metadata["help"]
    if f.metadata.get("cli_file"):  # a JSON schema, say: the option names a file that holds it
        parser.add_argument(flag, type=read_text, metavar="FILE", default=f.default, help=help_text + ", from FILE")
    elif kind is bool:  # --flag, or --flag/--no-flag when it is on by default
        action = argparse.BooleanOptionalAction if f.default else "store_true"
        parser.add_argument(flag, action=action, default=f.default, help=help_text)
    elif kind is list:
        parser.add_argument(flag, action="append", type=item_type(f), default=[], help=help_text + " (repeatable)")
    else:
        parser.add_argument(flag, type=kind, default=f.default, help=f"{help_text} (default {f.default})")


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__.splitlines()[0])
    p.add_argument("prompt")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=None,
                   help="default: $LLM_GRPC_PORT or 12345 (grpc), $LLM_HTTP_PORT or 12346 (http), as the server")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--api-key", default=None, help="the server's LLM_API_KEY (default: $LLM_API_KEY)")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message, through the model's chat template")
    for f in request_fields():  # the engine's request fields, as --max-tokens, --do-sample...
        add_option(p, f)
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    try:
        port = args.port or default_port(args.protocol)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sampling = {f.name: getattr(args, f.name) for f in request_fields()}
    if args.chat:
        sampling["messages"] = [{"role": "user", "content": args.prompt}]
    several = (args.n or 1) > 1  # answers arrive interleaved: each is printed whole when it ends
    try:
        async for doc in stream(args.prompt, host=args.host, port=port, protocol=args.protocol,
                                api_key=args.api_key, **sampling):
            if not several:
                sys.stdout.write(doc.text)
                sys.stdout.flush()
            if doc.finish_reason:
                if several:
                    print(f"[answer {doc.choice_index}]\n{doc.generated_text}", end="")
                print()
                print(f"[finish_reason={doc.finish_reason} prompt_tokens={doc.prompt_tokens} "
                      f"generated_tokens={doc.generated_tokens} seed={doc.seed}]", file=sys.stderr)
    except StreamError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2
    return 0


def main() -> None:
    sys.exit(asyncio.run(run(parse_args())))


if __name__ == "__main__":
    main()
