"""The one error type users see: a single sentence naming the problem and the valid choices."""


class ManytaskError(Exception):
    """A problem with the user's input (config, paths, choices). The CLI prints it without a traceback."""


def clipped(value: object, limit: int = 60) -> str:
    """`value` as text for an error message, cut to `limit` characters: errors never echo unbounded input."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


LISTED_CHARS = 280  # an error stays one readable sentence: a longer list of choices is cut and counted


def unknown_choice(what: str, given: str, choices: list[str] | tuple[str, ...]) -> ManytaskError:
    """Build the standard 'unknown X' error listing the valid choices (the first ones in order and their count,
    where all of them would not fit one sentence: `manytask list` shows every one)."""
    ordered = sorted(choices)
    listed = ", ".join(ordered)
    if len(listed) > LISTED_CHARS:
        shown = listed[:LISTED_CHARS].rsplit(", ", 1)[0]
        listed = f"{shown}, ... ({len(ordered)} in all; manytask list shows them)"
    return ManytaskError(f"unknown {what} '{clipped(given)}'; valid choices: {listed}.")
