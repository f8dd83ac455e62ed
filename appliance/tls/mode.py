"""Which TLS a config asks for (the `tls` setting's matrix, tested whole in tests/tls):

| tls_cert set | tls  | auth=people or api_keys_file | trusted_proxies | serves |
|---|---|---|---|---|
| yes | any | any | any | https with the operator's certificate |
| no | off | any | any | plain http (a proxy in front terminates TLS) |
| no | on | any | any | https with the box's own CA |
| no | auto | yes | none | https with the box's own CA |
| no | auto | yes | set | plain http: the proxy is the front door (systemd/nginx-appliance.conf) |
| no | auto | no | any | plain http: an open box carries no secret (the README's first command) |
"""

from __future__ import annotations

from enum import Enum

from appliance.config import Config


class Mode(Enum):
    PLAIN = "plain"
    OWN = "own"  # the operator's tls_cert and tls_key
    BOX = "box"  # the box's own CA (state_dir/tls)


def mode_of(cfg: Config) -> Mode:
    if cfg.tls_cert:
        return Mode.OWN
    if cfg.tls == "on":
        return Mode.BOX
    secrets = cfg.auth == "people" or bool(cfg.api_keys_file)
    return Mode.BOX if cfg.tls == "auto" and secrets and not cfg.trusted_proxies else Mode.PLAIN
