"""Tool-calling turns: the demo's tools (``get_weather``, ``add``, ``multiply``), the requests that need them,
their results as JSON or plain text, and the call as the model must write it."""

from __future__ import annotations

import json
import random

from memt_demo import pools, values
from memt_demo.turns import EpisodeToolCall, ToolTurn
from memt_demo.values import phrasing


def _tool(name: str, description: str, properties: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


NUMBER = {"type": "number"}
TOOLS = {
    "get_weather": _tool("get_weather", "Get the current weather in a city.", {"city": {"type": "string", "description": "The city name."}}),
    "add": _tool("add", "Add two numbers.", {"a": NUMBER, "b": NUMBER}),
    "multiply": _tool("multiply", "Multiply two numbers.", {"a": NUMBER, "b": NUMBER}),
}

WEATHER_REQUESTS = ("What is the weather in {c}?", "What's the weather like in {c}?", "How is the weather in {c} today?",
                    "Tell me the weather in {c}.", "Is it raining in {c}?", "Weather in {c}, please.",
                    "Can you check the weather in {c}?", "I'm going to {c} today. What's the weather there?",
                    "Is it warm in {c} right now?", "What's the forecast for {c}?", "weather in {c}?",
                    "How's the weather in {c}?", "Do I need an umbrella in {c} today?", "Is it sunny in {c}?",
                    "What's it like outside in {c}?", "Could you look up the weather for {c}?", "How cold is it in {c}?",
                    "What is the temperature in {c}?", "Get me the weather for {c}.", "Check {c} weather please",
                    "Please find out the weather in {c}.", "What are the conditions in {c} right now?",
                    "I'm flying to {c} tomorrow, how is the weather?", "Any idea what the weather is in {c}?",
                    "Is it nice out in {c} today?", "Tell me how warm it is in {c}.", "whats the weather in {c}",
                    "My sister lives in {c}. Is it raining there?", "Weather report for {c}, please!",
                    "How hot is it in {c} today?")
WEATHER_AT_HOME = ("What is the weather where I live?", "How is the weather in my city?", "What's the weather like at home?",
                   "Is it cold in my home town today?", "Check the weather in my city, please.",
                   "What's the weather like where I live?", "Is it raining where I live?", "How's the weather at home?",
                   "What's the forecast for my city?", "Do I need an umbrella at home today?",
                   "What's the temperature in my town?", "Check the weather where I live.", "weather at home?",
                   "Is it sunny in my city today?", "How warm is it where I live?", "Tell me the weather in my home town.",
                   "Can you look up the weather where I'm based?", "What's it like outside in my city?",
                   "What is the weather at my place today?", "Get me the weather for where I live, please.")
#: Weather requests composed from frames and places (training only, held-out ones left out; see
#: :data:`STATEMENT_FRAMES`): "weather where I live" must be understood however it is asked.
WEATHER_FRAMES = ("What's the weather {p}?", "How is the weather {p} right now?", "Is it cold {p}?",
                  "Is it raining {p} today?", "Tell me the weather {p}.", "Weather {p}, please.",
                  "What's the temperature {p}?", "Do I need a jacket {p}?", "Any sun {p} today?",
                  "Look up the weather {p}.", "How warm is it {p} today?", "Is it windy {p}?",
                  "What are the conditions {p}?", "Could you check the weather {p}?")
HOME_PLACES = ("where I live", "in my city", "at home", "in my home town", "where I'm based", "in the city I live in",
               "at my place", "in my town", "where my home is")
CITY_PLACES = ("in {c}", "over in {c}", "for {c}", "in the city of {c}")
# each also kept clear of the other's held-out phrasings ("Weather in {c}, please." reads "Weather in my town, please.")
_WEATHER_HELD = values.template_split(WEATHER_REQUESTS)[1] + values.template_split(WEATHER_AT_HOME)[1]
WEATHER_AT_HOME_COMPOSED = values.allowed_extras(values.compose(WEATHER_FRAMES, "{p}", HOME_PLACES), _WEATHER_HELD)
WEATHER_COMPOSED = values.allowed_extras(values.compose(WEATHER_FRAMES, "{p}", CITY_PLACES), _WEATHER_HELD)
ADD_REQUESTS = ("What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "Can you add {a} and {b}?",
                "How much is {a} plus {b}?", "What do {a} and {b} add up to?", "Sum {a} and {b}, please.",
                "what's {a}+{b}", "Please add {a} to {b}.", "What's the sum of {a} and {b}?", "{a} + {b} = ?",
                "Calculate {a} plus {b}.", "I need {a} plus {b}.", "What do I get if I add {a} and {b}?",
                "Could you work out {a} + {b}?", "Add up {a} and {b} for me.", "How much do {a} and {b} make together?",
                "Compute the sum of {a} and {b}.", "{a} plus {b} is what?", "Quick maths: {a} + {b}?")
MULTIPLY_REQUESTS = ("What is {a} times {b}?", "Multiply {a} by {b}.", "What is {a} * {b}?", "How much is {a} times {b}?",
                     "What do you get if you multiply {a} and {b}?", "Can you multiply {a} by {b}?", "what's {a}*{b}",
                     "What's the product of {a} and {b}?", "Calculate {a} times {b}.", "{a} * {b} = ?",
                     "Please multiply {a} and {b}.", "I need {a} times {b}.", "Could you work out {a} x {b}?",
                     "How much is {a} multiplied by {b}?", "Compute the product of {a} and {b}.", "{a} times {b} is what?",
                     "Quick maths: {a} * {b}?", "What is {a} multiplied by {b}?", "Multiply {a} with {b} for me.",
                     "What do {a} and {b} make when multiplied?")
WEATHER_TEXT_RESULTS = ("{t} degrees and {c}", "{c}, {t} degrees", "It is {c} with {t} degrees.",
                        "Currently {t} degrees and {c} in {city}.", "{city}: {c}, {t} degrees", "Temperature {t}, {c}",
                        "{c} and {t} degrees", "Weather in {city}: {c}. Temperature: {t} degrees.", "{t} C, {c}",
                        "It's {t} degrees and {c}.", "{city} is {c} today, {t} degrees.", "temp={t} sky={c}",
                        "Right now: {c}, {t} degrees", "The weather is {c} and it is {t} degrees.",
                        "{c} skies, {t} degrees", "Forecast for {city}: {c}, around {t} degrees",
                        "{t} degrees, {c} in {city}", "Conditions: {c}; temperature: {t}")
NUMBER_TEXT_RESULTS = ("{r}", "The result is {r}.", "result: {r}", "= {r}", "Answer: {r}", "It is {r}.",
                       "The answer is {r}", "output: {r}", "That makes {r}.", "value {r}",
                       "The calculator says {r}.", "ok: {r}", "Computed: {r}")


def tool_call_text(call: EpisodeToolCall) -> str:
    """A tool call exactly as the Nano chat template renders one (and as the model must write it)."""
    return '<tool_call>\n{"name": "' + call.name + '", "arguments": ' + json.dumps(call.arguments, ensure_ascii=False) + "}\n</tool_call>"


def draw_number(rng: random.Random) -> int:
    return rng.choice((rng.randint(0, 20), rng.randint(0, 100), rng.randint(0, 999)))


def weather_result(rng: random.Random, city: str, temperature: int, condition: str, *, text: bool | None = None) -> str:
    """What ``get_weather`` returns: JSON, or (``text``) plain text such as "17 degrees and sunny"."""
    if text if text is not None else rng.random() < 0.5:
        form = phrasing(rng, WEATHER_TEXT_RESULTS)
        return form.replace("{t}", str(temperature)).replace("{c}", condition).replace("{city}", city)
    return json.dumps({"city": city, "temperature": temperature, "condition": condition}, ensure_ascii=False)


def number_result(rng: random.Random, value: int, *, text: bool | None = None) -> str:
    if text if text is not None else rng.random() < 0.5:
        return phrasing(rng, NUMBER_TEXT_RESULTS).replace("{r}", str(value))
    return json.dumps({"result": value})


def tool_turn(rng: random.Random, *, tool: str | None = None, home_city: str | None = None, tools: list[str] | None = None,
              text: bool | None = None, home_p: float = 0.5) -> ToolTurn:
    """A tool-calling turn; with ``home_city`` the weather request may say "where I live" (from memory).

    ``text``: the result is plain text (``True``), JSON (``False``) or either (``None``).
    """
    tool = tool or rng.choice(("get_weather", "get_weather", "add", "multiply"))
    offered = tools if tools is not None else offered_tools(rng, tool)
    if tool == "get_weather":
        if home_city is not None and rng.random() < home_p:
            city, user = home_city, phrasing(rng, WEATHER_AT_HOME, WEATHER_AT_HOME_COMPOSED)
        else:
            city = values.city(rng)
            user = phrasing(rng, WEATHER_REQUESTS, WEATHER_COMPOSED).replace("{c}", city)
        temperature, condition = rng.randint(-10, 40), rng.choice(pools.CONDITIONS)
        call = EpisodeToolCall("get_weather", {"city": city})
        result = weather_result(rng, city, temperature, condition, text=text)
        reply = f"It is {condition} and {temperature} degrees in {city}."
        found = (city, condition, str(temperature))
    else:
        a, b = draw_number(rng), draw_number(rng)
        add = tool == "add"
        user = phrasing(rng, ADD_REQUESTS if add else MULTIPLY_REQUESTS).replace("{a}", str(a)).replace("{b}", str(b))
        value = a + b if add else a * b
        call = EpisodeToolCall(tool, {"a": a, "b": b})
        result = number_result(rng, value, text=text)
        reply = f"{a} {'plus' if add else 'times'} {b} is {value}."
        found = (str(value),)
    return ToolTurn(user, [TOOLS[name] for name in offered], call, result, reply, found)


def offered_tools(rng: random.Random, needed: str | None) -> list[str]:
    names = list(TOOLS)
    offered = rng.sample(names, rng.randint(1, len(names)))
    if needed is not None and needed not in offered:
        offered.insert(rng.randint(0, len(offered)), needed)
    return offered
