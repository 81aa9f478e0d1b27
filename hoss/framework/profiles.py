"""Policy profiles: configs/policies.yaml -> named `Profile`s of configured plugins.

The file (schema `PoliciesFile`)::

    defaultProfile: default          # the profile for pods without a hoss.io/policy label
    profiles:
      - name: default
        filters:                     # run in this order; a node is reported under the first that rejects it
          - name: NodeResourcesFit
          - name: NodeAffinity
        scores:
          - name: LeastAllocated
            weight: 1                # 1..100, multiplies the plugin's 0..100 score
            args: {resources: {cpu: 1, memory: 1}}

More keys:

    namespacePools: {team-a: pool-a}  # top level: tenant namespace -> node pool (default of every NodePool filter)
    profiles:
      - name: gang-topology
        topologyKey: topology.hoss.io/leaf   # node label naming the leaf switch; gangs pack onto few leaves
        extenders:                   # kube-scheduler HTTP extenders, consulted after the plugins
          - urlPrefix: http://extender.example:8888/scheduler
            filterVerb: filter       # optional; POST <urlPrefix>/filter
            prioritizeVerb: prioritize
            weight: 2                # multiplies the extender's 0..10 priority, scaled to 0..100
            nodeCacheCapable: false  # false: send a minimal node list; true: node names only
            ignorable: true          # true: skip the extender when it fails; false: the pod is unschedulable
            timeoutSeconds: 5

Plugins come from `hoss.framework.plugins.load_registry`: the built-ins and the ``hoss.plugins`` entry points.

Every mistake -- YAML syntax, an unknown key, an unknown plugin, a plugin listed twice, a bad weight or plugin
arg, a bad extender, a default that names no profile, tenants mapped to pools while a profile has no NodePool
filter to confine them -- raises `ProfileError` naming the profile, plugin and field, so a worker refuses to
start on a policy file it would misread. `profile_for` picks a pod's profile by its policy label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from pydantic_core import ErrorDetails

from hoss.framework.cycle import ExtenderConfig, FilterPlugin, Profile, ScorePlugin
from hoss.framework.errors import ProfileError
from hoss.framework.plugins import Registry, load_registry
from hoss.framework.plugins.pools import NAMESPACE_POOLS_ARG, NodePool
from hoss.framework.pod import POLICY_LABEL, PodView

MAX_SCORE_WEIGHT = 100

_Plugin = TypeVar("_Plugin", FilterPlugin, ScorePlugin)


class PluginEntry(BaseModel):
    """A plugin in a profile."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The plugin's registered name, e.g. ``NodeResourcesFit``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """The plugin's own settings; each plugin validates its args."""


class ScoreEntry(PluginEntry):
    """A score plugin in a profile, with its weight."""

    weight: StrictInt = Field(default=1, ge=1, le=MAX_SCORE_WEIGHT)
    """Multiplies the plugin's 0..100 normalised score in the node's total."""


class ProfileEntry(BaseModel):
    """One named profile."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The profile's name, as pods give it in the ``hoss.io/policy`` label."""
    filters: list[PluginEntry] = Field(default_factory=list)
    """Filter plugins, in the order they run."""
    scores: list[ScoreEntry] = Field(default_factory=list)
    """Score plugins and their weights."""
    extenders: list[ExtenderConfig] = Field(default_factory=list)
    """HTTP scheduler extenders (kube-scheduler's protocol), consulted in order after the plugins."""
    topology_key: str | None = Field(default=None, alias="topologyKey", min_length=1)
    """The node label that names a node's leaf switch; gangs under this profile pack onto the fewest leaves."""


class PoliciesFile(BaseModel):
    """The whole policies.yaml."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    default_profile: str = Field(alias="defaultProfile", min_length=1)
    """The profile for pods without a ``hoss.io/policy`` label."""
    profiles: list[ProfileEntry] = Field(min_length=1)
    namespace_pools: dict[str, str] = Field(default_factory=dict, alias="namespacePools")
    """Tenant namespace -> the node pool its pods are confined to; the default of every NodePool filter."""


def load_profiles(path: str | Path) -> tuple[dict[str, Profile], str]:
    """The profiles in the YAML file at `path`, by name, and the default profile's name."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ProfileError(reason=f"cannot read the policy file: {error}", source=source) from error
    return profiles_from_text(text, source=source)


def profiles_from_text(text: str, *, source: str = "policies.yaml") -> tuple[dict[str, Profile], str]:
    """The profiles in the text of a policy file, by name, and the default profile's name (a worker reloading its
    file parses what it read)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ProfileError(reason=f"not valid YAML: {error}", source=source) from error
    return parse_profiles(data, source=source)


def parse_profiles(data: object, *, source: str = "policies.yaml") -> tuple[dict[str, Profile], str]:
    """The profiles in already-parsed policy data, by name, and the default profile's name."""
    try:
        config = PoliciesFile.model_validate(data)
    except ValidationError as error:
        raise _schema_error(error, data, source=source) from error
    registry = load_registry(source=source)
    profiles: dict[str, Profile] = {}
    for position, entry in enumerate(config.profiles):
        if entry.name in profiles:
            raise ProfileError(
                profile=entry.name, field=f"profiles[{position}].name", reason="duplicate profile name", source=source
            )
        if config.namespace_pools and not any(plugin.name == NodePool.name for plugin in entry.filters):
            # Without the filter, this profile would be a way out of the tenant's pool.
            raise ProfileError(
                profile=entry.name,
                field="filters",
                reason=f"namespacePools confines tenants to pools, so every profile needs the {NodePool.name} filter",
                source=source,
            )
        filters = [
            plugin.model_copy(update={"args": {NAMESPACE_POOLS_ARG: config.namespace_pools, **plugin.args}})
            if plugin.name == NodePool.name
            else plugin
            for plugin in entry.filters
        ]
        profiles[entry.name] = Profile(
            name=entry.name,
            filters=_plugins(
                profile=entry.name,
                kind="filters",
                entries=filters,
                factories=registry.filters,
                registry=registry,
                source=source,
            ),
            scores=list(
                zip(
                    _plugins(
                        profile=entry.name,
                        kind="scores",
                        entries=entry.scores,
                        factories=registry.scores,
                        registry=registry,
                        source=source,
                    ),
                    (score.weight for score in entry.scores),
                    strict=True,
                )
            ),
            extenders=tuple(entry.extenders),
            topology_key=entry.topology_key,
        )
    if config.default_profile not in profiles:
        raise ProfileError(
            field="defaultProfile",
            reason=f"{config.default_profile!r} names no profile; profiles: {', '.join(sorted(profiles))}",
            source=source,
        )
    return profiles, config.default_profile


def profile_for(pod: PodView, profiles: Mapping[str, Profile], default: str) -> Profile:
    """The profile the pod's ``hoss.io/policy`` label names, else the default; raises `ProfileError` if unknown."""
    name = pod.policy if pod.policy is not None else default
    profile = profiles.get(name)
    if profile is None:
        asked = f"label {POLICY_LABEL}={name!r}" if pod.policy is not None else f"default profile {name!r}"
        raise ProfileError(
            profile=name,
            field=f"metadata.labels.{POLICY_LABEL}" if pod.policy is not None else None,
            reason=f"pod {pod.key} asks for {asked}, which names no profile; profiles: {', '.join(sorted(profiles))}",
            source="pod",
        )
    return profile


def _plugins(
    *,
    profile: str,
    kind: str,
    entries: Sequence[PluginEntry],
    factories: Mapping[str, Callable[[Mapping[str, Any]], _Plugin]],
    registry: Registry,
    source: str,
) -> list[_Plugin]:
    plugins: list[_Plugin] = []
    seen: set[str] = set()
    for position, entry in enumerate(entries):
        field = f"{kind}[{position}]"
        factory = factories.get(entry.name)
        if factory is None:
            kind_name, other_kind = ("filter", "score") if kind == "filters" else ("score", "filter")
            other = registry.scores if kind == "filters" else registry.filters
            hint = (
                f"it is a {other_kind} plugin, list it under {other_kind}s"
                if entry.name in other
                else f"known {kind_name} plugins: {', '.join(sorted(factories))}"
            )
            raise ProfileError(
                profile=profile, plugin=entry.name, field=f"{field}.name", reason=f"unknown; {hint}", source=source
            )
        if entry.name in seen:
            raise ProfileError(
                profile=profile,
                plugin=entry.name,
                field=f"{field}.name",
                reason=f"listed twice in {kind}",
                source=source,
            )
        seen.add(entry.name)
        try:
            plugins.append(factory(entry.args))
        except ValidationError as error:
            detail: ErrorDetails = error.errors()[0]
            raise ProfileError(
                profile=profile,
                plugin=entry.name,
                field=_dotted([f"{field}.args", *detail["loc"]]),
                reason=_reason(detail),
                source=source,
            ) from error
        except (ValueError, TypeError) as error:
            # Entry-point plugins may validate their args without pydantic.
            raise ProfileError(
                profile=profile,
                plugin=entry.name,
                field=f"{field}.args",
                reason=f"{error} ({registry.origins.get(entry.name, 'unknown origin')})",
                source=source,
            ) from error
    return plugins


def _schema_error(error: ValidationError, data: object, *, source: str) -> ProfileError:
    """The first schema violation, with the profile and plugin it sits in named from the raw data."""
    detail = error.errors()[0]
    loc = tuple(detail["loc"])
    profile = plugin = None
    field_loc: tuple[str | int, ...] = loc
    if len(loc) >= 2 and loc[0] == "profiles" and isinstance(loc[1], int):
        raw_profile = _item(_get(data, "profiles"), loc[1])
        profile = _name(raw_profile, fallback=f"profiles[{loc[1]}]")
        field_loc = loc[2:]
        if len(loc) >= 4 and loc[2] in ("filters", "scores") and isinstance(loc[3], int):
            plugin = _name(_item(_get(raw_profile, str(loc[2])), loc[3]), fallback=None)
    return ProfileError(
        profile=profile, plugin=plugin, field=_dotted(field_loc) or None, reason=_reason(detail), source=source
    )


def _reason(detail: ErrorDetails) -> str:
    given = detail.get("input")
    shown = "" if isinstance(given, dict | list) or detail.get("type") == "missing" else f" (got {given!r})"
    return f"{detail['msg']}{shown}"


def _dotted(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _get(data: object, key: str) -> object:
    return data.get(key) if isinstance(data, Mapping) else None


def _item(data: object, position: int) -> object:
    return data[position] if isinstance(data, list) and 0 <= position < len(data) else None


def _name(data: object, *, fallback: str | None) -> str | None:
    name = _get(data, "name")
    return name if isinstance(name, str) and name else fallback
