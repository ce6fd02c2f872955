"""Ten JSON schemas for the structured-output tests: nested objects, arrays, enums, numbers with ranges, required
fields. Strings and arrays are bounded so that a small model's output ends within a few dozen tokens."""

NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["color", "count"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": NAME,
            "location": {
                "type": "object",
                "properties": {
                    "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                    "lon": {"type": "integer", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
                "additionalProperties": False,
            },
        },
        "required": ["city", "location"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 16}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4},
    {
        "type": "object",
        "properties": {"title": NAME, "rating": {"type": "number", "minimum": 0, "maximum": 5}},
        "required": ["title", "rating"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "role": {"enum": ["admin", "guest"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "level": {"enum": ["low", "mid", "high"]},
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 5},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["level", "scores"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            "note": {"type": ["string", "null"], "maxLength": 10},
        },
        "required": ["answer", "confidence", "note"],
        "additionalProperties": False,
    },
]

PROMPTS = [
    "Describe a person as JSON.",
    "Pick a color and a count, as JSON.",
    "A city and its coordinates in JSON:",
    "Three tags for a blog post, JSON:",
    "Is water wet? Answer in JSON.",
    "Some numbers as a JSON array:",
    "Rate a movie in JSON.",
    "A user record in JSON:",
    "A level with scores, JSON:",
    "Answer yes or no in JSON.",
]
