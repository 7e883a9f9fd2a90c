"""The agent manifest, ``agent.json``: what an agent is, thinks with and may do.

A minimal manifest names the agent; everything else has a default::

    {"identity": {"name": "weather-bot"}}

A fuller one::

    {
      "identity": {"name": "weather-bot", "version": "1.2.0", "description": "Weather answers"},
      "instructions": "You are a concise weather assistant.",
      "provider": {"name": "openai", "model": "gpt-4o-mini", "apiKeyEnv": "OPENAI_API_KEY"},
      "tools": ["get_weather", "fs.read", "my_package.tools:forecast"],
      "fs": {"allowedPaths": ["./data"]},
      "limits": {"maxToolRounds": 5, "toolTimeout": 10},
      "memory": {"window": 20},
      "mcp": {"expose_tools": ["get_weather"], "private_tools": ["fs.read"]}
    }

Field names are the wire names above (camelCase, except the snake_case keys of
``mcp``). Every object rejects unknown keys, so a misspelt key is an error, and
values are not coerced: ``"toolTimeout": "30"`` is an error, not 30 seconds.

:func:`load_manifest` reads a file; :func:`parse_manifest` (or
:meth:`AgentManifest.from_dict`) takes the decoded JSON. Both raise
:class:`~openstarry.errors.ManifestError`, whose message names the file and
the field (``limits.toolTimeout``, ``tools[2]``) and says what is wrong.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import ComputedFieldInfo, FieldInfo
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from openstarry.errors import ManifestError

__all__ = [
    "MANIFEST_FILENAME",
    "MAX_MANIFEST_BYTES",
    "A2AAgentConfig",
    "A2AConfig",
    "AgentManifest",
    "ApiConfig",
    "FsConfig",
    "Identity",
    "Limits",
    "McpConfig",
    "McpServerConfig",
    "MemoryConfig",
    "ProviderConfig",
    "ToolRetrievalConfig",
    "load_manifest",
    "parse_manifest",
]

#: The conventional name of a manifest file.
MANIFEST_FILENAME = "agent.json"

_JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: What a manifest given as data is called in error messages.
_DATA_NAME = "manifest data"


def _title(name: str, info: FieldInfo | ComputedFieldInfo) -> str:
    """A schema title from a field's name: ``max_tool_rounds`` becomes ``Max tool rounds``."""
    return name.replace("_", " ").strip().capitalize()


class _Section(BaseModel):
    """The shared configuration: wire names, unknown keys rejected, no coercion.

    Python code may build the models with the snake_case field names too.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        field_title_generator=_title,
    )


class Identity(_Section):
    """Who the agent is."""

    name: str = Field(min_length=1, description="The agent's name.")
    version: str = Field(default="0.1.0", description="The agent's version.")
    description: str = Field(default="", description="What the agent is for.")


class ProviderConfig(_Section):
    """The provider (the agent's brain, spec 000 ``IProvider``) and its settings."""

    name: str = Field(
        default="default", min_length=1, description="Which provider: a registered provider's name."
    )
    model: str | None = Field(default=None, description="The model the provider asks for.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Provider-specific settings, such as temperature."
    )
    base_url: str | None = Field(
        default=None, description="The API's base URL, for a custom endpoint."
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable holding the API key (not the key): a name "
        "of letters, digits and underscores, not starting with a digit.",
    )


class FsConfig(_Section):
    """What the ``fs.*`` tools may touch."""

    allowed_paths: list[str] = Field(
        default_factory=list,
        description="Directories the fs.* tools may touch; relative ones are relative to the "
        "manifest's folder, and ~ is the home directory. One that resolves to /, a system "
        "folder or outside the manifest's folder needs allowOutside.",
    )
    allow_outside: bool = Field(
        default=False,
        description="Accept allowedPaths that resolve to /, a system folder (/etc, /usr, ...) "
        "or outside the manifest's folder; without it such a path is an error.",
    )

    @field_validator("allowed_paths")
    @classmethod
    def _non_empty(cls, paths: list[str]) -> list[str]:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("bad_path", message),
                loc=(index,),
                input=path,
            )
            for index, path in enumerate(paths)
            for message in (
                ["an allowed path must not be empty"]
                if not path
                else ["an allowed path must not contain a NUL character"]
                if "\0" in path
                else []
            )
        ]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return paths


class Limits(_Section):
    """Bounds on what one turn of the agent may do."""

    max_tool_rounds: int = Field(
        default=10, ge=1, description="Provider calls per user turn before the loop stops."
    )
    tool_timeout: float = Field(default=30.0, gt=0, description="Seconds a tool may run.")
    provider_timeout: float = Field(
        default=120.0, gt=0, description="Seconds a provider call may take."
    )
    max_concurrent_tools: int = Field(
        default=4, ge=1, description="Tool calls of one response run at once, at most."
    )
    max_failure_streak: int = Field(
        default=5, ge=1, description="Consecutive failed rounds before the turn is abandoned."
    )
    repeated_failure_warning: int = Field(
        default=3,
        ge=2,
        description="After this many identical failing calls, the provider is told to change "
        "course.",
    )


class MemoryConfig(_Section):
    """What the agent remembers of a session."""

    window: int | None = Field(
        default=50, ge=1, description="User turns kept in memory; null keeps every turn."
    )


class BusConfig(_Section):
    """Where the agent's events go: no ``bus`` is the in-process bus."""

    url: str | None = Field(
        default=None,
        min_length=1,
        description='"redis://host:port/db" for the Redis Streams bus shared by many '
        'workers, "redis+cluster://host:port[,host:port...]" for it on a Redis Cluster; '
        "null for the in-process bus.",
    )
    group: str | None = Field(
        default=None, min_length=1, description='The consumer group (default "openstarry").'
    )
    consumer: str | None = Field(
        default=None,
        min_length=1,
        description="This worker's name in the group (default: host name and process id).",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="Replicas that must hold a flush before its publishes are answered "
        "(Redis WAIT): an accepted publish then survives the loss of its master. "
        "Default 0: answered at once.",
    )


class SessionsConfig(_Section):
    """Where sessions' memory lives between runs."""

    store: str | None = Field(
        default=None,
        min_length=1,
        description='"memory" (in the agent\'s process), "sqlite:///PATH" (one machine, '
        'survives a restart) or "redis://host:port/db" (shared by workers); null: '
        "the bus's Redis when the bus is on Redis, else memory.",
    )


class McpServerConfig(_Section):
    """A remote MCP server whose tools become the agent's (keys in snake_case).

    Give ``command`` (a program started and spoken to over stdio) or ``url``
    (a Streamable HTTP endpoint), not both. Its tools join the agent's as
    ``<name>.<tool>``.
    """

    model_config = ConfigDict(alias_generator=None)

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="What the server's tools are prefixed with: <name>.<tool>.",
    )
    command: list[str] | None = Field(
        default=None,
        min_length=1,
        description="The program and its arguments, for a server over stdio.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the program."
    )
    cwd: str | None = Field(
        default=None, description="The program's working directory, relative to the manifest."
    )
    url: str | None = Field(default=None, description="The server's Streamable HTTP URL.")
    tools: list[str] | None = Field(
        default=None, description="Only these of the server's tools (all when absent)."
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to connect and list the tools (default: limits.toolTimeout).",
    )
    approval: bool = Field(
        default=False,
        description="Every call to this server's tools waits for a person's approval.",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) and url (HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


class McpConfig(_Section):
    """Which tools an MCP server of this agent shows, and which remote servers it uses
    (keys in snake_case)."""

    model_config = ConfigDict(alias_generator=None)

    servers: list[McpServerConfig] = Field(
        default_factory=list,
        description="Remote MCP servers whose tools the agent may call.",
    )

    expose_tools: list[str] = Field(
        default_factory=list, description="Tools of the agent an MCP client may call."
    )
    private_tools: list[str] = Field(
        default_factory=list, description="Tools of the agent never shown to an MCP client."
    )
    expose_resources: list[str] = Field(
        default_factory=list,
        description="Resources an MCP client may list and read: paths relative to the "
        "manifest's folder inside fs.allowedPaths (a file, or a folder ending in '/' whose "
        "files are all exposed), or 'package.module:attribute' references to Python "
        "resources.",
    )
    private_resources: list[str] = Field(
        default_factory=list,
        description="Paths under an exposed folder that an MCP client never sees.",
    )


class A2AAgentConfig(_Section):
    """A remote agent spoken to over A2A 1.0, as one tool of this agent."""

    name: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="The tool's name."
    )
    url: str = Field(
        pattern=r"^https?://",
        description="The agent's base URL: its card is at <url>/.well-known/agent-card.json.",
    )
    timeout: float | None = Field(
        default=None, gt=0, description="Seconds to read its card (default: limits.toolTimeout)."
    )
    approval: bool = Field(default=False, description="Each call waits for a person's approval.")


class A2AConfig(_Section):
    """The remote agents this agent may call over A2A."""

    agents: list[A2AAgentConfig] = Field(
        default_factory=list, max_length=64, description="Each a tool (the [a2a] extra)."
    )


class ApprovalConfig(_Section):
    """Tools whose calls wait for a person's yes before they run (human in the loop)."""

    tools: list[str] = Field(
        default_factory=list, description="The tools (names in tools) that need approval."
    )
    timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a call waits for an answer; unanswered, it is denied.",
    )


class ApiConfig(_Section):
    """What callers of the Agent API over HTTP (``openstarry serve``) may run (snake_case keys)."""

    model_config = ConfigDict(alias_generator=None)

    expose_tools: list[str] = Field(
        default_factory=list,
        description="Tools an HTTP caller may run directly with a slash command (/name args); "
        "none by default. Tools in mcp.private_tools are never reachable over HTTP. The "
        "built-in commands (/help, /stop, ...) always work.",
    )


class ToolRetrievalConfig(_Section):
    """The tool retrieval layer (spec 000 section 6B)."""

    top_n: int | None = Field(
        default=None,
        ge=1,
        description="When the agent has more tools than this, only this many of the most "
        "relevant to the input reach the provider; null sends every tool.",
    )
    retriever: str = Field(
        default="lexical",
        min_length=1,
        description='"lexical" (the built-in scorer of names and descriptions) or an import '
        'reference "package.module:attribute" to a ToolRetriever.',
    )


class AgentManifest(_Section):
    """An agent's ``agent.json``.

    The manifest remembers its folder (:attr:`base_dir`): the file's folder, or
    for data the ``base_dir`` given (the working directory by default). Relative
    paths in it, such as ``fs.allowedPaths``, are relative to that folder;
    :meth:`resolve` and :meth:`allowed_paths` resolve them.

    Beyond each field's own rules: ``tools`` has no duplicates, and each name in
    ``mcp.expose_tools`` and ``mcp.private_tools`` is in ``tools`` (spelt the
    same) and in only one of the two.
    """

    identity: Identity = Field(description="Who the agent is.")
    instructions: str | None = Field(
        default=None, description="A system prompt, for providers built on an LLM."
    )
    provider: ProviderConfig = Field(
        default_factory=ProviderConfig, description="The agent's brain."
    )
    tools: list[str] = Field(
        default_factory=list,
        description='Built-in tool names ("fs.read", "get_weather") or import references '
        '("package.module:attribute"); no duplicates.',
    )
    fs: FsConfig = Field(default_factory=FsConfig, description="What the fs.* tools may touch.")
    approval: ApprovalConfig = Field(
        default_factory=ApprovalConfig, description="Calls that wait for a person's approval."
    )
    limits: Limits = Field(default_factory=Limits, description="Bounds on a turn.")
    memory: MemoryConfig = Field(
        default_factory=MemoryConfig, description="What the agent remembers."
    )
    mcp: McpConfig = Field(
        default_factory=McpConfig,
        description="What an MCP server of the agent shows, and the remote servers it uses.",
    )
    a2a: A2AConfig = Field(
        default_factory=A2AConfig, alias="a2a", description="Remote agents over A2A 1.0."
    )
    api: ApiConfig = Field(
        default_factory=ApiConfig,
        description="What callers of the Agent API over HTTP may run directly.",
    )
    tool_retrieval: ToolRetrievalConfig = Field(
        default_factory=ToolRetrievalConfig,
        description="Which tools reach the provider when the agent has many.",
    )
    bus: BusConfig = Field(
        default_factory=BusConfig,
        description="The event bus: in-process by default, or Redis Streams shared by workers.",
    )
    sessions: SessionsConfig = Field(
        default_factory=SessionsConfig, description="Where sessions' memory is kept."
    )

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, tools: list[str]) -> list[str]:
        errors: list[InitErrorDetails] = []
        first: dict[str, int] = {}
        for index, name in enumerate(tools):
            if not name or any(c.isspace() for c in name):
                errors.append(
                    _detail(
                        (index,), "tool_name", "a tool name must be non-empty, without spaces", name
                    )
                )
            elif name in first:
                errors.append(
                    _detail(
                        (index,),
                        "duplicate_tool",
                        f"duplicate tool {name!r} (already tools[{first[name]}])",
                        name,
                    )
                )
            else:
                first[name] = index
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return tools

    @model_validator(mode="after")
    def _mcp_names_are_tools(self) -> AgentManifest:
        tools = set(self.tools)
        exposed = set(self.mcp.expose_tools)
        errors: list[InitErrorDetails] = []
        # A remote server's tools are named <server>.<tool>; which exist is
        # known only once connected, so any name under a server's prefix passes.
        remote = tuple(f"{server.name}." for server in self.mcp.servers)
        seen_servers: set[str] = set()
        for index, server in enumerate(self.mcp.servers):
            if server.name in seen_servers:
                errors.append(
                    _detail(
                        ("mcp", "servers", index, "name"),
                        "duplicate_server",
                        f"two servers are named {server.name!r}",
                        server.name,
                    )
                )
            seen_servers.add(server.name)
        for index, agent in enumerate(self.a2a.agents):
            if agent.name in tools or agent.name in seen_servers:
                why = f"{agent.name!r} already names a tool, a server or an agent"
                errors.append(
                    _detail(("a2a", "agents", index, "name"), "duplicate", why, agent.name)
                )
            seen_servers.add(agent.name)
        tools |= {agent.name for agent in self.a2a.agents}
        for section, key, names in (
            ("mcp", "expose_tools", self.mcp.expose_tools),
            ("mcp", "private_tools", self.mcp.private_tools),
            ("api", "expose_tools", self.api.expose_tools),
            ("approval", "tools", self.approval.tools),
        ):
            for index, name in enumerate(names):
                loc = (section, key, index)
                if name not in tools and not name.startswith(remote or ("\0",)):
                    ref = next(
                        (t for t in self.tools if ":" in t and t.rpartition(":")[2] == name), None
                    )
                    hint = f"; name an imported tool by its entry in tools: {ref!r}" if ref else ""
                    errors.append(
                        _detail(loc, "unknown_tool", f"{name!r} is not in tools{hint}", name)
                    )
                elif section == "api" and name in self.mcp.private_tools:
                    errors.append(
                        _detail(
                            loc,
                            "exposed_and_private",
                            f"{name!r} is in mcp.private_tools: never reachable over HTTP",
                            name,
                        )
                    )
                elif key == "private_tools" and name in exposed:
                    errors.append(
                        _detail(
                            loc,
                            "exposed_and_private",
                            f"{name!r} is in both expose_tools and private_tools",
                            name,
                        )
                    )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def base_dir(self) -> Path:
        """The absolute folder relative paths of the manifest are relative to."""
        return self._base_dir

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """``path`` made absolute: ``~`` expanded, relative to :attr:`base_dir`, links resolved."""
        return (self._base_dir / Path(path).expanduser()).resolve()

    def allowed_paths(self) -> list[Path]:
        """``fs.allowedPaths``, each resolved by :meth:`resolve`."""
        return [self.resolve(p) for p in self.fs.allowed_paths]

    @classmethod
    def from_dict(
        cls, data: Any, *, base_dir: str | os.PathLike[str] | None = None
    ) -> AgentManifest:
        """A manifest from decoded JSON; relative paths in it are relative to ``base_dir``.

        ``base_dir`` defaults to the working directory.

        Raises:
            ManifestError: ``data`` is not a valid manifest (``path`` is ``None``).
        """
        return _validate(data, name=_DATA_NAME, path=None, base_dir=base_dir)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of ``agent.json``, with its wire names."""
        return {"$schema": _JSON_SCHEMA_DIALECT, **cls.model_json_schema(by_alias=True)}


def _detail(loc: tuple[str | int, ...], kind: str, message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)


def parse_manifest(data: Any, base_dir: str | os.PathLike[str] | None = None) -> AgentManifest:
    """:meth:`AgentManifest.from_dict` as a function."""
    return AgentManifest.from_dict(data, base_dir=base_dir)


#: The largest ``agent.json`` :func:`load_manifest` reads.
MAX_MANIFEST_BYTES = 1 << 20


def load_manifest(path: str | os.PathLike[str]) -> AgentManifest:
    """Read and validate a manifest file; its relative paths are relative to its folder.

    Raises:
        ManifestError: the file cannot be read, is not JSON (the message gives
            the line and column), or is not a valid manifest (the message names
            each offending field). ``.path`` is the file as given, ``.field`` the
            first offending field's dotted wire path.
    """
    name = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO must not block the open; only a regular file is read.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ManifestError(f"{name}: not a regular file", path=name)
            raw = file.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"{name}: larger than {MAX_MANIFEST_BYTES} bytes: not a manifest", path=name
            )
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{name}: not UTF-8 text ({e.reason})", path=name) from e
    except OSError as e:
        raise ManifestError(
            f"{name}: cannot read the manifest: {e.strerror or e}", path=name
        ) from e
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise ManifestError(
            f"{name}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", path=name
        ) from e
    except _DuplicateKey as e:
        raise ManifestError(f"{name}: invalid JSON: duplicate key {e.key!r}", path=name) from e
    except RecursionError:
        raise ManifestError(f"{name}: invalid JSON: nested too deeply", path=name) from None
    except ValueError as e:  # such as an integer past Python's digit limit
        raise ManifestError(f"{name}: invalid JSON: {e}", path=name) from e
    return _validate(data, name=name, path=name, base_dir=Path(os.path.abspath(name)).parent)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _validate(
    data: Any, *, name: str, path: str | None, base_dir: str | os.PathLike[str] | None
) -> AgentManifest:
    if not isinstance(data, dict):
        raise ManifestError(
            f"{name}: a manifest must be a JSON object, not {_json_kind(data)}", path=path
        )
    try:
        manifest = AgentManifest.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as e:
        problems = [(_wire_path(err["loc"]), _describe(err)) for err in e.errors()]
        if len(problems) == 1:
            field, message = problems[0]
            text = f"{name}: {field}: {message}"
        else:
            lines = "".join(f"\n  {field}: {message}" for field, message in problems)
            text = f"{name}: {len(problems)} problems:{lines}"
        raise ManifestError(text, path=path, field=problems[0][0]) from None
    manifest._base_dir = Path(os.path.abspath(base_dir)) if base_dir is not None else Path.cwd()
    if not manifest.fs.allow_outside:
        for index, raw in enumerate(manifest.fs.allowed_paths):
            problem = _outside_problem(manifest.resolve(raw), manifest.base_dir.resolve())
            if problem is not None:
                field = f"fs.allowedPaths[{index}]"
                raise ManifestError(
                    f"{name}: {field}: {raw!r} resolves to {problem}; the fs.* tools would "
                    'reach it: set "fs": {"allowOutside": true} if that is meant',
                    path=path,
                    field=field,
                )
    return manifest


#: Folders of the operating system: an allowed path in one needs ``allowOutside``.
_SYSTEM_FOLDERS = tuple(
    Path(p)
    for p in (
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var/lib",
        "/var/log",
        "/System",
        "/Library",
        "/private/etc",
    )
)


def _outside_problem(resolved: Path, base_dir: Path) -> str | None:
    """Why ``resolved``, an allowed path, needs ``allowOutside`` (``None``: it does not)."""
    if resolved == Path(resolved.anchor):
        return f"{resolved}, the root of the file system"
    if resolved.is_relative_to(base_dir):
        return None
    for system in _SYSTEM_FOLDERS:
        if resolved.is_relative_to(system):
            return f"{resolved}, a system folder"
    if os.name == "nt" and "windows" in (part.lower() for part in resolved.parts[1:2]):
        return f"{resolved}, a system folder"
    return f"{resolved}, outside the manifest's folder {base_dir}"


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _wire_path(loc: tuple[str | int, ...]) -> str:
    """``("limits", "toolTimeout")`` as ``limits.toolTimeout``, ``("tools", 2)`` as ``tools[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(manifest)"


def _describe(err: ErrorDetails) -> str:
    """One problem in words, with the offending value where it helps."""
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        message = "unknown field"
        key = err["loc"][-1]
        known = _known_keys(err["loc"][:-1])
        close = difflib.get_close_matches(str(key), known, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        elif known:
            message += f" (known: {', '.join(known)})"
        return message
    message = err["msg"]
    if kind in _OWN_CHECKS:
        return message
    subject, should, rest = message.partition(" should ")
    if should and " " not in subject:  # "Input should be ...", "String should have ..."
        message = "must " + rest
    return f"{message}, got {_short(err['input'])}"


#: The error types of this module's own checks, whose messages name the value.
_OWN_CHECKS = frozenset(
    {"empty_path", "tool_name", "duplicate_tool", "unknown_tool", "exposed_and_private"}
)


def _short(value: Any) -> str:
    text = json.dumps(value) if _is_json(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _known_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The wire keys of the model at ``loc`` (empty when ``loc`` is not a model)."""
    model: type[BaseModel] = AgentManifest
    for part in loc:
        if not isinstance(part, str):
            return []
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return []
        model = sub
    return [f.alias or n for n, f in model.model_fields.items()]
