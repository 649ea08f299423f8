"""Hooks for scripts/schemathesis-test.sh (SCHEMATHESIS_HOOKS=schemathesis_hooks).

A quota name may hold %XX escapes ("ip_%7F%00%00%01" stands for four bytes), and the server
percent-decodes the path, so in a URL such a name has its % written %25. schemathesis takes a
%XX in a generated path value as already encoded: it would send "ip_%7F" and the server
would read the byte 0x7F. Before each call this hook rebuilds the name schemathesis meant
and escapes its %, so the server reads exactly the generated name.
"""

import re

import schemathesis
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.transport.serialization import EncodedPath

# What a name holds without escaping: quote() escapes ':' and '@', a name never does.
NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@-")
ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def generated_name(value: str) -> str:
    """The name behind schemathesis's encoded path value: quote()'s own escapes of name
    characters and of a final '*' undone, the name's %XX escapes kept, and the escapes it
    undid ('~' is one: quote() leaves it bare) put back."""

    def decode(m: re.Match) -> str:
        ch = chr(int(m.group(1), 16))
        if ch in NAME_CHARS or (ch == "*" and m.end() == len(value)):
            return ch
        return m.group(0)

    def escape(i: int, ch: str) -> str:
        if ch in NAME_CHARS or ch == "%" or (ch == "*" and i == len(value) - 1):
            return ch
        return "".join(f"%{b:02X}" for b in ch.encode())

    value = "".join(escape(i, ch) for i, ch in enumerate(value))
    return ESCAPE.sub(decode, value)


@schemathesis.hook
def before_call(context, case, kwargs):
    name = (case.path_parameters or {}).get("name")
    if not isinstance(name, str) or isinstance(name, EncodedPath):
        return
    # A schema-violating name is sent as schemathesis made it: the server must refuse it
    # whatever it decodes to.
    meta = case.meta
    if meta is not None:
        component = meta.components.get(ParameterLocation.PATH)
        if component is not None and component.mode != GenerationMode.POSITIVE:
            return
    name = generated_name(name)
    if "%" in name:
        # Only % escaped (the rest of a name is fine in a path as it is), so the value
        # still matches the schema when schemathesis checks it again after this change.
        case.path_parameters["name"] = EncodedPath(name.replace("%", "%25"))


@schemathesis.hook
def filter_case(context, case):
    # /v1/quotas/x:reset is also the quota named "x:reset" (names may hold ':'), which takes
    # GET, PUT and DELETE: an undocumented method there is the quota route's, not a 405, and
    # its Allow header rightly lists methods the reset lacks. The document cannot say so (and
    # checks cannot be turned off for one operation), so only POST is sent there; the other
    # methods are tested through /v1/quotas/{name}.
    return not case.operation.path.endswith(":reset") or case.method.upper() == "POST"
