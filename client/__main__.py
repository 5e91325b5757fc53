"""python -m client "prompt" [--host H] [--port P] [--protocol grpc|http] [sampling options]

Prints tokens as they arrive, then a summary line on stderr.
"""
import argparse
import asyncio
import sys

from . import StreamError, stream


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__.splitlines()[0])
    p.add_argument("prompt")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=None, help="default: 12345 (grpc) or 12346 (http)")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message, through the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--typical-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    port = args.port or (12345 if args.protocol == "grpc" else 12346)
    sampling = dict(max_tokens=args.max_tokens, do_sample=args.do_sample,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    typical_p=args.typical_p, repetition_penalty=args.repetition_penalty,
                    seed=args.seed, stop=args.stop)
    if args.chat:
        sampling["messages"] = [{"role": "user", "content": args.prompt}]
    try:
        async for doc in stream(args.prompt, host=args.host, port=port, protocol=args.protocol,
                                **sampling):
            sys.stdout.write(doc.text)
            sys.stdout.flush()
            if doc.finish_reason:
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
