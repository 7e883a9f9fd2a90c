"""``get_weather``: an offline, deterministic weather tool for demos and tests.

No network is involved. A dozen cities have fixed weather (Taipei is 25 °C and
sunny, as in spec 000 section 5); any other location gets weather derived from
the SHA-256 of its normalised name, so it is the same on every run and every
machine.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import Field

from openstarry.agent.tools import tool
from openstarry.errors import ToolError

__all__ = ["CONDITIONS", "KNOWN_WEATHER", "get_weather"]

#: The conditions a location not in :data:`KNOWN_WEATHER` may get.
CONDITIONS = ("Sunny", "Partly cloudy", "Cloudy", "Overcast", "Rainy", "Windy", "Foggy", "Snowy")

#: Fixed weather by city: (temperature in °C, condition).
KNOWN_WEATHER: dict[str, tuple[int, str]] = {
    "Taipei": (25, "Sunny"),
    "Tokyo": (18, "Cloudy"),
    "Seoul": (14, "Partly cloudy"),
    "Singapore": (31, "Thunderstorms"),
    "Sydney": (22, "Sunny"),
    "Mumbai": (30, "Hazy"),
    "Dubai": (36, "Sunny"),
    "Cairo": (29, "Sunny"),
    "Moscow": (-4, "Snowy"),
    "Berlin": (9, "Overcast"),
    "Paris": (13, "Rainy"),
    "London": (11, "Rainy"),
    "Reykjavik": (2, "Windy"),
    "New York": (16, "Partly cloudy"),
    "San Francisco": (15, "Foggy"),
}

_KNOWN = {name.casefold(): name for name in KNOWN_WEATHER}


@tool(name="get_weather")
def get_weather(
    location: Annotated[str, Field(min_length=1)],
    unit: Literal["celsius", "fahrenheit"] = "celsius",
) -> dict[str, Any]:
    """Get the current weather for a location (simulated offline data).

    Args:
        location: The city, such as "Taipei" or "Paris, France".
        unit: The temperature unit.
    """
    name = " ".join(location.split())
    key = name.casefold()
    if not key:
        raise ToolError("get_weather: location must not be empty", code="EINVAL")
    if unit not in ("celsius", "fahrenheit"):
        raise ToolError(f"get_weather: unknown unit {unit!r}", code="EINVAL")
    # "Paris, France" is Paris.
    known = _KNOWN.get(key) or _KNOWN.get(key.split(",", 1)[0].strip())
    if known is not None:
        name = known
        celsius, condition = KNOWN_WEATHER[known]
    else:
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        celsius = -10 + int.from_bytes(digest[:2], "big") % 46  # -10 to 35 °C
        condition = CONDITIONS[digest[2] % len(CONDITIONS)]
    if unit == "celsius":
        temperature, symbol = celsius, "°C"
    else:
        temperature, symbol = round(celsius * 9 / 5 + 32), "°F"
    return {
        "location": name,
        "temperature": temperature,
        "unit": unit,
        "condition": condition,
        "summary": f"{temperature}{symbol}, {condition}",
    }
