"""Runs a command against the moto server of the S3 tests: reads the state
file that `moto_server.py --daemon` wrote (ctest's fixture s3.server.start)
and runs the command with the AWS variables of ckpt/open_storage.h set for
the server's user.

    with_server_env.py STATE_FILE -- COMMAND ARGS...

Exits with the command's status; 1 if the state file holds no server
(moto missing: the fixture reports why).
"""
import json
import os
import sys


def main() -> int:
    sep = sys.argv.index("--")
    with open(sys.argv[1]) as f:
        info = json.load(f)
    if "endpoint" not in info:
        print(f"no S3 test server: {info.get('error', 'unknown')}")
        return 1
    env = dict(os.environ)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN",
                 "CKPT_S3_ADDRESSING", "CKPT_S3_CONDITIONAL_WRITES",
                 "CKPT_S3_SINGLE_WRITER"):
        env.pop(name, None)
    env.update({
        "AWS_ENDPOINT_URL": info["endpoint"],
        "AWS_REGION": info["region"],
        "AWS_ACCESS_KEY_ID": info["user"]["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": info["user"]["secret_access_key"],
    })
    cmd = sys.argv[sep + 1:]
    os.execvpe(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
