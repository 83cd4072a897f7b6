"""The one word pattern of the keyword labelers and text statistics: lower-case letters, with an apostrophe part."""

import re

WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
