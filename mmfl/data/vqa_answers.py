"""VQA answer normalisation, as the official VQA v2 evaluation script does it
(punctuation, digits and articles, contractions), so predicted and human answers compare
as the benchmark compares them."""

from __future__ import annotations

import re




# The tables of the official VQA evaluation (vqaEval.py, VQA API): contractions written without
# their apostrophe are restored (the capitalised keys never match lower-cased words; kept as
# the official table has them), number words become digits, articles are dropped.

CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've",
    "hasnt": "hasn't", "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've",
    "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've",
    "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've",
    "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't",
    "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock",
    "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at",
    "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's",
    "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've",
    "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's",
    "whereve": "where've", "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've",
    "youll": "you'll", "youre": "you're", "youve": "you've",
}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`",
               ",", "?", "!")
_COMMA_IN_NUMBER = re.compile(r"(\d)(,)(\d)")
# the official pattern is "(?!<=\d)(\.)(?!\d)": its "(?!<=\d)" is a look-ahead that never
# fails before a ".", so in effect a period is removed unless a digit follows it ("2.5" stays)
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``: each mark of :data:`PUNCTUATION` is deleted where it
    touches a space (or the text has a digit-comma-digit), else replaced by a space; periods not
    followed by a digit are deleted. ``"yes!" -> "yes"``, ``"t-shirt" -> "t shirt"``,
    ``"1,000" -> "1000"``, ``"2.5" -> "2.5"``."""
    out = text
    number_comma = _COMMA_IN_NUMBER.search(text) is not None
    for p in PUNCTUATION:
        if p + " " in text or " " + p in text or number_comma:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower-case words, number words to digits
    (``"two" -> "2"``, ``"none" -> "0"``), articles dropped, contractions restored
    (``"dont" -> "don't"``), words joined by one space."""
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ARTICLES]
    return " ".join(CONTRACTIONS.get(w, w) for w in words)


def normalize_answer(text: str) -> str:
    """An answer as the official evaluation compares it: newlines and tabs to spaces, stripped,
    then :func:`process_punctuation` and :func:`process_digit_article`.
    ``"A Dog." -> "dog"``, ``"Two" -> "2"``, ``"isnt" -> "isn't"``."""
    text = str(text).replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(text))
