"""Run pyinfra operations' inner generators against facts a test supplies.

pyinfra's `@operation` keeps the undecorated generator as `op._inner`; iterating it
under a host context yields the commands the operation would run. This is how
pyinfra's own operation tests work: facts in, exact commands out. A fact the test did
not supply fails the test, so an operation cannot silently read something unexpected.
"""

from __future__ import annotations

from contextlib import contextmanager

from pyinfra.api import Config, FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from control.profile import build
from roles.facts.driver import PciDevice


def F(cls, **kwargs):
    """Key for a fact with arguments: facts={F(File, path="/x"): None}."""
    return (cls, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


class FakeState:
    is_executing = False
    print_noop_info = False
    current_stage = StateStage.Prepare  # plans are made before anything runs

    def __init__(self):
        self.ops = {}  # no operation has run: pyinfra_ext/memo.py counts changes from here
        self.config = Config()  # pyinfra's defaults: the connector arguments of a root login


class FakeData:
    """A host without inventory data: every connector argument takes pyinfra's default."""


class FakeHost:
    def __init__(self, facts: dict, name: str = "node1"):
        self.facts = dict(facts)
        self.name = name
        self.noops: list[str] = []
        self.fact_calls: list[str] = []
        self.in_op = False
        self.current_op_global_arguments = None
        self.current_deploy_kwargs = None
        self.data = FakeData()
        self.state = FakeState()

    def get_fact(self, cls, *args, **kwargs):
        assert not args, "pass fact arguments by keyword"
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        self.fact_calls.append(cls.__name__)
        exact = F(cls, **kwargs)
        if exact in self.facts:
            return self.facts[exact]
        if cls in self.facts:
            return self.facts[cls]
        raise AssertionError(f"the test gave no fact {cls.__name__} {kwargs}")

    def run_shell_command(self, command, **kwargs):
        """No shell here: facts read together (pyinfra_ext/memo.py) fall back to get_fact one by one."""
        return False, None

    def noop(self, description: str) -> None:
        self.noops.append(description)


def render(command) -> str:
    if isinstance(command, str):
        return command
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        try:
            content = src.getvalue() if hasattr(src, "getvalue") else open(src).read()
        except UnicodeDecodeError:  # a wheel, say
            content = f"<binary file {src}>"
        return f"upload {command.dest}\n{content}"
    if isinstance(command, FunctionCommand):
        return f"function {command.function.__name__}"
    raise AssertionError(f"unexpected command {command!r}")


@contextmanager
def on(fake: FakeHost):
    with ctx_state.use(fake.state), ctx_host.use(fake):
        yield fake


def commands(op, facts: dict, **kwargs) -> list[str]:
    """The commands `op(**kwargs)` yields on a host with `facts`."""
    fake = FakeHost(facts)
    with on(fake):
        return [render(c) for c in op._inner(**kwargs)]


class Recorder:
    """Stand-in for the decorated operations a role's apply() calls: records each call
    with the commands its inner generator yields on the fake host."""

    def __init__(self, fake: FakeHost):
        self.fake = fake
        self.calls: list[tuple[str, list[str]]] = []

    def wrap(self, op):
        def call(*args, **kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k != "name" and not k.startswith("_")}
            self.calls.append((op.__name__, [render(c) for c in op._inner(*args, **kwargs)]))

        call._inner = op._inner
        call.__name__ = op.__name__
        return call

    def patch(self, monkeypatch, *modules):
        for module in modules:
            for attr in dir(module):
                obj = getattr(module, attr)
                if (
                    callable(obj)
                    and hasattr(obj, "_inner")
                    and getattr(obj, "__module__", "").startswith(("roles.", "pyinfra_ext."))
                ):
                    monkeypatch.setattr(module, attr, self.wrap(obj))

    @property
    def all_commands(self) -> list[str]:
        return [c for _, cmds in self.calls for c in cmds]


def refusal(op, facts: dict, **kwargs) -> str:
    """Why `op` fails this host on `facts`: the message of its one refusal command
    (pyinfra_ext/refusal.py), which fails that host only when the run reaches it."""
    fake = FakeHost(facts)
    with on(fake):
        (command,) = op._inner(**kwargs)
    assert isinstance(command, FunctionCommand) and command.function.__name__ == "_fail_this_host", command
    return command.args[0]


# The GB10's one GPU on its PCI bus (lspci -n on DGX OS: vendor 10de, device 2e12, class 0300).
GB10_BUS = [PciDevice("000f:01:00.0", "0x2e12", "0x030000")]


def gb10_box():
    """A GB10 profile as the example inventory would give it (its placeholder ref)."""
    return build(
        "spark",
        {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True},
        api_key_present=False,
    )
