"""A real S3 protocol server for the tests: moto's server on loopback, with
signature checking on, so that a request signed with a wrong key fails with
403 SignatureDoesNotMatch as it would on S3.

While moto still accepts unauthenticated requests, this script creates,
through moto's own IAM and STS endpoints (with boto3, as moto documents for
its IAM access control), a user allowed s3:* with an access key, and a role
it may assume; it assumes the role for temporary credentials with a session
token. Then it turns authentication on (moto's /moto-api/reset-auth, i.e.
INITIAL_NO_AUTH_ACTION_COUNT = 0): every later request must be signed by
one of those keys.

    moto_server.py                      serve in the foreground: print the
                                        server's JSON on one line, serve
                                        until stdin is closed
    moto_server.py --daemon STATE_FILE  start a server in the background,
                                        write its JSON to STATE_FILE, return
                                        once it serves (ctest's fixture)
    moto_server.py --stop STATE_FILE    stop that server

The JSON: {"endpoint": "http://127.0.0.1:PORT", "region": "us-east-1",
"user": {"access_key_id", "secret_access_key"}, "session":
{"access_key_id", "secret_access_key", "session_token"}, "pid"}. Without
moto it is {"error": "..."} and the exit status 0, so that tests skip,
except under CI=true, where a missing moto fails (exit 1).

Also a module for Python tests: `with MotoServer() as info: ...`.
"""
import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

REGION = "us-east-1"
_ALLOW_ALL = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:*"],
                   "Resource": "*"}],
})


def _setup_identities(endpoint: str) -> dict:
    """Creates the user, its key and the assumed role's session."""
    import boto3  # a dependency of moto

    def client(service):
        return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                            aws_access_key_id="setup",
                            aws_secret_access_key="setup")

    iam = client("iam")
    user = iam.create_user(UserName="ckpt-test")["User"]
    iam.put_user_policy(UserName="ckpt-test", PolicyName="s3",
                        PolicyDocument=_ALLOW_ALL)
    key = iam.create_access_key(UserName="ckpt-test")["AccessKey"]
    trust = json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                       "Principal": {"AWS": user["Arn"]}}],
    })
    role = iam.create_role(RoleName="ckpt-test-role",
                           AssumeRolePolicyDocument=trust)["Role"]
    iam.put_role_policy(RoleName="ckpt-test-role", PolicyName="s3",
                        PolicyDocument=_ALLOW_ALL)
    creds = client("sts").assume_role(RoleArn=role["Arn"],
                                      RoleSessionName="ckpt-test",
                                      DurationSeconds=43200)["Credentials"]
    return {
        "user": {"access_key_id": key["AccessKeyId"],
                 "secret_access_key": key["SecretAccessKey"]},
        "session": {"access_key_id": creds["AccessKeyId"],
                    "secret_access_key": creds["SecretAccessKey"],
                    "session_token": creds["SessionToken"]},
    }


def _require_auth(endpoint: str) -> None:
    import urllib.request
    # Not a form: werkzeug would consume the body as form data.
    req = urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0",
                                 method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


class MotoServer:
    """moto on 127.0.0.1 (a free port) in this process, auth on."""

    def __enter__(self) -> dict:
        import logging
        from moto.server import ThreadedMotoServer
        # No line per request on stderr.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0,
                                          verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        info = {"endpoint": endpoint, "region": REGION}
        info.update(_setup_identities(endpoint))
        _require_auth(endpoint)
        info["pid"] = os.getpid()
        return info

    def __exit__(self, *exc) -> None:
        self._server.stop()


def _missing_moto() -> str:
    try:
        for module in ("moto.server", "boto3"):
            importlib.import_module(module)
    except ImportError as e:
        return (f"moto[server] is not installed ({e}); scripts/setup "
                f"installs it into .venv/ from requirements.txt")
    return ""


def _serve_while_alive(watch_pid: int) -> None:
    """Daemon: serves until stopped, or until `watch_pid` (ctest) is gone."""
    with MotoServer() as info:
        print(json.dumps(info), flush=True)
        while _alive(watch_pid):
            time.sleep(1)


def _is_moto_server(pid: int) -> bool:
    """Whether `pid` still runs this script (not a process reusing it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"moto_server.py" in f.read()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", metavar="STATE_FILE")
    ap.add_argument("--stop", metavar="STATE_FILE")
    ap.add_argument("--watch-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    ci = os.environ.get("CI") == "true"

    if args.stop:
        try:
            with open(args.stop) as f:
                pid = json.load(f).get("pid")
        except FileNotFoundError:
            return 0
        if pid and _is_moto_server(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        os.remove(args.stop)
        return 0

    missing = _missing_moto()
    if missing:
        print(json.dumps({"error": missing}), flush=True)
        if args.daemon:
            with open(args.daemon, "w") as f:
                json.dump({"error": missing}, f)
        print(f"moto_server.py: {missing}", file=sys.stderr)
        return 1 if ci else 0

    if args.daemon:
        # The server's stderr goes to a log beside the state file: ctest
        # waits for every holder of the launcher's own stderr to exit.
        with open(args.daemon + ".log", "wb") as log:
            child = subprocess.Popen(
                [sys.executable, __file__, "--watch-pid", str(os.getppid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
        line = child.stdout.readline()
        child.stdout.close()
        if not line:
            with open(args.daemon + ".log") as log:
                sys.stderr.write(log.read())
            print("moto_server.py: the server did not start", file=sys.stderr)
            return 1
        tmp = args.daemon + ".tmp"
        with open(tmp, "wb") as f:
            f.write(line)
        os.replace(tmp, args.daemon)
        return 0

    if args.watch_pid:
        _serve_while_alive(args.watch_pid)
        return 0

    # Foreground: until the parent closes our stdin (or dies).
    eof = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), eof.set()),
                     daemon=True).start()
    with MotoServer() as info:
        print(json.dumps(info), flush=True)
        eof.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
