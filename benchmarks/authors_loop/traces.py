"""The two reasoning traces the tiny random models are forced to write, and their prompt::

    for trace in TRACES:  # "orders" (330 tokens, 7 cues), "train" (354 tokens, 8 cues)
        messages = trace.messages(session=uuid.uuid4().hex)  # ~866 tokens, never seen before

The prompt is opened by a fresh random id, so every generation starts with a cold cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RULES = [
    "read the whole question before you start and restate what is being asked",
    "write every intermediate quantity with its unit so that nothing is ambiguous",
    "prefer exact whole numbers and keep fractions until the very end of the work",
    "check each multiplication by doing it a second time in a different order",
    "keep a running total when several amounts have to be added together",
    "say which assumption you make whenever the question leaves something open",
    "use short sentences and one idea for each sentence in the reasoning",
    "never skip a step because it looks obvious, since small slips add up quickly",
    "when a number is given in words, rewrite it in digits before using it",
    "compare the final result with a rough estimate made at the start",
    "if two readings of the question are possible, solve the more natural one",
    "state the final answer once, clearly, after the reasoning is complete",
    "do not invent data that the question does not give you",
    "list the quantities that are known before computing anything with them",
    "when units differ, convert them to the same unit before combining them",
    "treat every stop, wait or pause in a journey as part of the total time",
    "round only the final answer, and only when the question asks for rounding",
    "mention the method in one sentence before applying it to the numbers",
    "recheck the question once the answer is found to see that it was answered",
    "keep the answer short and put the key number in the first sentence",
]

SYSTEM = (
    "Session {session}. You are a careful assistant that solves everyday arithmetic "
    "questions step by step. Follow these rules in every answer. "
    + " ".join(f"Rule {i + 1}: {rule}." for i, rule in enumerate(RULES * 2))
)


@dataclass(frozen=True)
class Trace:
    name: str
    question: str
    text: str  # what the model writes: "<think>\n...\n</think>\n\n" + the answer

    def messages(self, session: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM.format(session=session)},
            {"role": "user", "content": self.question},
        ]


TRACES = [
    Trace(
        "orders",
        "Three orders: four books at ten dollars each, five pens at six dollars each, and one "
        "lamp at twenty five dollars. What is the total cost of the three orders?",
        "<think>\nThe user asks for the total cost of three orders and wants every step shown "
        "clearly. I will read the orders one at a time and keep a running total as I go. The "
        "first order has four books, and each book costs ten dollars. Therefore, the first "
        "order costs forty dollars in total. I write that number down and move on to the "
        "second order in the message. Now the second order has five pens at six dollars for "
        "each pen. I multiply the count by the price to get the cost of that order. Therefore, "
        "the second order costs thirty dollars. Adding the first two orders together gives a "
        "subtotal that I should keep in mind. Now the subtotal after two orders is seventy "
        "dollars. The third order is a single lamp, and its listed price is twenty five "
        "dollars. Therefore, the three orders together cost ninety five dollars. Before "
        "answering I want to check each step once more to be sure nothing was missed. Now I "
        "check the first order again and four times ten is still forty. The second and third "
        "orders also match the prices given in the message. Therefore, the final total of "
        "ninety five dollars is correct. I will state the total and show how each order "
        "contributes to it.\n</think>\n\nThe total cost of the three orders is 95 dollars. The "
        "first order is 4 books at 10 dollars each, which is 40 dollars. The second order is 5 "
        "pens at 6 dollars each, which is 30 dollars. The third order is one lamp at 25 "
        "dollars. Adding them gives 40 + 30 + 25 = 95 dollars.",
    ),
    Trace(
        "train",
        "A train travels 120 km at 60 km/h, then 90 km at 45 km/h, stops for 30 minutes, and "
        "then travels 150 km at 75 km/h. How long does the whole trip take?",
        "<think>\nThe question asks how long the whole trip takes when a train makes three "
        "legs at different speeds. I need the distance and the speed of each leg, and then "
        "the time of each leg. The first leg is one hundred twenty kilometres at sixty "
        "kilometres per hour. Therefore, the first leg takes two hours. That part is simple, "
        "so I go on to the second leg of the journey. Now the second leg is ninety kilometres "
        "at forty five kilometres per hour. Dividing the distance by the speed gives the time "
        "for that leg as well. Therefore, the second leg also takes two hours. The train then "
        "waits at a station before the last leg begins. Now the stop at the station lasts "
        "thirty minutes according to the question. The third leg is one hundred fifty "
        "kilometres at seventy five kilometres per hour. Therefore, the third leg takes two "
        "hours as well. I add the three legs and the stop to get the total time of the trip. "
        "Now the three legs give six hours of travel in total. With the thirty minute stop "
        "the total grows by half an hour. Therefore, the whole trip takes six and a half "
        "hours. Let me verify the arithmetic of each leg one more time before I answer. Now "
        "each division gives exactly two hours with no remainder. So the total stands and I "
        "can write the final answer for the user.\n</think>\n\nThe whole trip takes 6 hours "
        "and 30 minutes. The first leg takes 120 / 60 = 2 hours, the second leg takes 90 / 45 "
        "= 2 hours and the third leg takes 150 / 75 = 2 hours. Together with the 30 minute "
        "stop at the station, the total is 6.5 hours.",
    ),
]
