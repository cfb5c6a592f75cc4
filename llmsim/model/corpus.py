"""The built-in sentences that random mode draws its text from.

Written for llmsim; every sentence ends with one space so that sentences concatenate
into running text.  They vary in length, punctuation and digits so that streamed
pieces exercise a client's text handling, and they are plain ASCII so that every
tokenizer splits them into whole-character pieces.
"""

from __future__ import annotations

__all__ = ["SENTENCES"]

SENTENCES: tuple[str, ...] = (
    "The simulator is running and every token arrives right on time. ",
    "Hello there, how can I help you today? ",
    "Checking, checking: one, two, three. ",
    "A quiet harbor holds seven small boats and one old lighthouse. ",
    "The river bends twice before it reaches the sea. ",
    "Please remember to water the tomatoes on Tuesday. ",
    "Our latest measurement came in at 42.7 degrees, slightly above the forecast. ",
    "If the queue is full, wait a moment and try the request again. ",
    "Bright kites drifted over the hill while the wind kept changing direction. ",
    "Nothing here is real, yet the numbers still add up. ",
    "She packed a map, a compass, and three sandwiches for the trip. ",
    "Step 1: open the box; step 2: read the label; step 3: smile. ",
    "The library opens at nine and closes when the last reader leaves. ",
    "Is it raining in the valley, or is that just fog? ",
    "Every good benchmark starts with a boring, predictable baseline. ",
    "The committee met for 90 minutes and agreed on exactly one thing. ",
    "Fresh bread smells best on a cold morning. ",
    "He counted the stars until he fell asleep somewhere near 300. ",
    "Latency is a budget, and every layer spends a little of it. ",
    "The train left the station at 7:15 (two minutes late). ",
    "Good questions often matter more than quick answers. ",
    "A small green frog sat on a large gray stone. ",
    "The recipe calls for flour, sugar, butter, and a pinch of salt. ",
    "Tomorrow will be mostly sunny with a light breeze from the west. ",
    "Write the test first, then make it pass, then make it clean. ",
    "The old clock in the hall chimes once every quarter hour. ",
    "Mountains look closer in the clear air after a storm. ",
    "Thank you for waiting; your answer is on its way. ",
    "Two plus two is four, and four times four is sixteen. ",
    "The gardener planted tulips along the north wall. ",
    "We measured twice, cut once, and still needed more tape. ",
    "Some streams end early, and a careful client notices. ",
    "The market was busy, loud, and full of bright colors. ",
    "Far away, a dog barked at the passing bicycles. ",
    "Data arrives in small pieces, one after another. ",
    "The bridge was painted red so that ships could see it through the mist. ",
    "Keep calm and check the logs. ",
    "Clouds gathered over the fields, but the rain never came. ",
    "A well-placed comma can change the meaning of a sentence. ",
    "That's all for now; see you next time! ",
)
