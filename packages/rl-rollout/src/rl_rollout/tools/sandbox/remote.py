"""The ``remote`` backend: a SandboxFusion service (``POST {remote_url}/run_code``)."""

NAME = "remote"


def run(code, config):
    raise NotImplementedError
