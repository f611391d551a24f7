"""Word pools of the synthetic memory tasks.

Every pool of *entities* (names, places, answer values, topic words) is dealt into three
disjoint parts, one per split (:func:`pool_for_split`), so train, validation and test
instances never share an entity. Filler sentences and templates hold no pool word and
are shared by all splits.
"""

from __future__ import annotations

from collections.abc import Sequence

SPLITS = ("train", "validation", "test")
SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation", "eval": "validation"}


def canonical_split(split: str) -> str:
    """``train`` / ``validation`` / ``test`` for a split name or one of its aliases (``val``, ``dev``,
    ...)."""
    name = SPLIT_ALIASES.get(split.lower(), split.lower())
    if name not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS} (or {sorted(SPLIT_ALIASES)})")
    return name


def pool_for_split(pool: Sequence, split: str) -> list:
    """This split's share of ``pool``: every third item, starting at the split's position."""
    return list(pool[SPLITS.index(canonical_split(split)) :: len(SPLITS)])


FIRST_NAMES = (
    "Adela", "Bruno", "Celine", "Dorian", "Elodie", "Fabian", "Greta", "Hector", "Ingrid", "Jasper",
    "Katja", "Leopold", "Mirela", "Nikolai", "Odette", "Pascal", "Rosalind", "Soren", "Tamsin", "Ulrich",
    "Valentina", "Wendell", "Ximena", "Yorick", "Zelda", "Anselm", "Beatrix", "Casimir", "Delphine", "Emeric",
    "Florentyna", "Gideon", "Henrietta", "Isidore", "Jolanda", "Konrad", "Lucinda", "Matthias", "Nerea",
    "Oswin", "Perpetua", "Quentin", "Rafaela", "Sebastien", "Theodora", "Umberto", "Viveka", "Wilhelmina",
    "Yannick", "Zora", "Alaric", "Brigitta", "Cornelius", "Dagny", "Evander", "Fenna", "Gustavo", "Hedda",
    "Ignatius", "Juno",
)
LAST_NAMES = (
    "Abernathy", "Brandvold", "Castellano", "Drummond", "Eklund", "Falkenrath", "Gallagher", "Hartigan",
    "Ivanova", "Jablonski", "Kowalczyk", "Lindqvist", "Marchetti", "Norrington", "Okonkwo", "Pemberton",
    "Quarrington", "Rasmussen", "Szabo", "Thorvaldsen", "Underhill", "Vasquez", "Whitcombe", "Yamaguchi",
    "Zielinski", "Ashgrove", "Bellweather", "Carrington", "Delacroix", "Eriksen", "Fairbanks", "Grimaldi",
    "Holloway", "Iglesias", "Jorgensen", "Kettering", "Lachance", "Montgomery", "Nakamura", "Oyelaran",
    "Prendergast", "Ravensworth", "Silvermane", "Tremblay", "Valdemar", "Westergaard", "Yeardley", "Zamorano",
    "Ambrose", "Blackwood", "Cuthbertson", "Dunmore", "Esterhazy", "Fitzwilliam", "Greenhalgh", "Harcourt",
    "Ingleby", "Kilbride", "Loxley", "Merriweather",
)
CITIES = (
    "Lisbon", "Tallinn", "Porto", "Ljubljana", "Valparaiso", "Trondheim", "Montevideo", "Salzburg",
    "Kraków", "Cartagena", "Hobart", "Bergen", "Marrakesh", "Antwerp", "Quito", "Dubrovnik",
    "Galway", "Nagasaki", "Bratislava", "Adelaide", "Seville", "Tbilisi", "Halifax", "Bologna",
    "Cusco", "Aarhus", "Kyoto", "Vilnius", "Innsbruck", "Cebu", "Granada", "Dunedin",
    "Riga", "Zanzibar", "Lucerne", "Oaxaca",
)
PET_NAMES = (
    "Biscuit", "Pumpernickel", "Waffles", "Juniper", "Marmalade", "Pickles", "Noodle", "Cinnamon",
    "Barnaby", "Tofu", "Clementine", "Gizmo", "Dumpling", "Pepperoni", "Muffin", "Sprocket",
    "Truffle", "Wasabi", "Nutmeg", "Bramble", "Custard", "Pistachio", "Rascal", "Zucchini",
    "Chutney", "Doodle", "Fudge", "Hazelnut", "Jellybean", "Kipper", "Lollipop", "Mochi",
    "Parsnip", "Quokka", "Sherbet", "Toffee",
)
DISHES = (
    "mushroom risotto", "lentil curry", "fish tacos", "beef stroganoff", "pumpkin ravioli", "shakshuka",
    "chicken katsu", "spinach lasagne", "pad thai", "goulash", "paella", "falafel wraps",
    "ramen with miso", "stuffed peppers", "moussaka", "jambalaya", "pierogi", "bibimbap",
    "cauliflower gratin", "clam chowder", "tagine with apricots", "gnocchi in sage butter", "borscht",
    "empanadas", "duck confit", "laksa", "ratatouille", "ceviche", "pho", "cassoulet",
    "tamales", "kedgeree", "okonomiyaki", "ribollita", "biryani", "chilli con carne",
)
PROFESSIONS = (
    "marine biologist", "court stenographer", "piano tuner", "air traffic controller", "glassblower",
    "beekeeper", "cartographer", "sound engineer", "orthodontist", "locksmith", "tax auditor",
    "wildlife photographer", "bridge inspector", "perfumer", "radio host", "stonemason",
    "veterinary nurse", "patent attorney", "luthier", "meteorologist", "dietitian", "sommelier",
    "bookbinder", "crane operator", "archivist", "toxicologist", "set designer", "river pilot",
    "florist", "seismologist",
)
INSTRUMENTS = (
    "cello", "banjo", "oboe", "harp", "accordion", "mandolin", "bassoon", "ukulele", "trombone",
    "sitar", "harmonica", "clarinet", "marimba", "bagpipes", "flute", "double bass", "saxophone",
    "harpsichord", "viola", "tuba", "zither",
)
HOBBIES = (
    "rock climbing", "birdwatching", "sailing", "pottery", "geocaching", "fencing", "kayaking",
    "origami", "beekeeping", "orienteering", "calligraphy", "archery", "woodcarving", "salsa dancing",
    "astronomy", "quilting", "falconry", "bouldering", "canoe polo", "stamp collecting", "juggling",
    "paragliding", "knitting", "fly fishing",
)
STREETS = (
    "Juniper Lane", "Haverford Road", "Mulberry Street", "Kestrel Avenue", "Quarry Hill", "Foxglove Close",
    "Lantern Row", "Bramley Way", "Pilgrim Street", "Copperfield Road", "Heron Drive", "Thistle Court",
    "Beacon Terrace", "Wren Gardens", "Saltmarsh Lane", "Falcon Crescent", "Tannery Walk", "Meadowbank Road",
    "Chapel Yard", "Larkspur Avenue", "Ironbridge Street", "Willowmere Close", "Granary Lane", "Sparrow Hill",
)
LANGUAGES = (
    "Portuguese", "Finnish", "Swahili", "Icelandic", "Georgian", "Tagalog", "Hungarian", "Welsh",
    "Vietnamese", "Catalan", "Estonian", "Amharic", "Basque", "Korean", "Maltese", "Quechua",
    "Slovenian", "Yoruba", "Greek", "Latvian", "Farsi",
)

#: Episodic activities (verb phrases) for the timeline family.
ACTIVITIES = (
    "repainted the garden shed", "baked rye bread", "repaired a bicycle chain", "planted tulip bulbs",
    "visited the planetarium", "cleaned the aquarium", "assembled a bookshelf", "went to a glazing workshop",
    "restrung a guitar", "hiked to the waterfall", "replaced a leaking tap", "sorted old letters",
    "trained for the relay race", "painted a sunset watercolour", "built a birdhouse",
    "cooked a lobster dinner", "rehearsed a violin duet", "sanded the oak table",
    "photographed a lunar eclipse", "wrote a sonnet", "repotted the cactus", "took the ferry to the island",
    "organised a chess tournament", "knitted a blue scarf", "tiled the bathroom floor",
    "visited the cheese market", "fixed the garage door", "flew a kite at the beach",
    "carved a pumpkin lantern", "mended a fishing net", "tuned the old piano", "picked wild blackberries",
    "renewed a passport", "climbed the clock tower", "brewed ginger beer", "learned to juggle clubs",
    "donated blood", "framed a vintage map", "groomed the neighbour's horse", "recorded a podcast episode",
    "waxed the surfboard", "adopted a tortoise", "sewed new curtains", "rebuilt a stone wall",
    "judged a baking contest", "toured the salt mine", "varnished the rowing boat", "ran a charity quiz",
    "cleared the gutters", "sketched the cathedral", "pickled red cabbage", "restored a rocking chair",
    "tested a homemade kaleidoscope", "swam across the lake", "catalogued seashells",
    "installed a rain barrel", "spun wool on a wheel", "laid a brick path", "printed linocut posters",
    "bottled elderflower cordial",
)

#: Reading-passage pools for the summary family: protagonists come from the names;
#: places and key objects here.
TOWNS = (
    "Harrowmere", "Saltcombe", "Wyndle Cross", "Ebbridge", "Corvasse", "Lowmarsh", "Tarrowby",
    "Dunvegan Reach", "Mirefield", "Kestlow", "Brackenholt", "Fennick Bay", "Ostrava Vale", "Quillstone",
    "Rookhaven", "Sable Point", "Thornwick", "Umberfell", "Varrow", "Whitlow Sands", "Ashenby", "Bellmouth",
    "Caldermoor", "Drayhaven",
)
KEY_OBJECTS = (
    "brass compass", "hurricane lamp", "sealed letter", "silver locket", "ship's logbook", "copper kettle",
    "pocket watch", "stained map", "wooden flute", "iron key", "violet scarf", "clay jar",
    "leather satchel", "glass float", "weather vane", "oil painting", "carved chess piece", "tin whistle",
    "fishing lure", "signet ring", "music box", "bell rope", "lacquered box", "spyglass",
    "storm barometer", "pressed flower", "ivory comb", "account book", "lantern hook", "woven basket",
    "rusty grapnel", "velvet pouch", "bone button", "feather quill", "amber bead", "cracked mirror",
    "marble statue", "hand-drawn chart", "rope ladder", "snow globe", "candle mould", "tide table",
    "brass doorknocker", "wax seal", "linen sail", "cobalt vase", "pewter mug", "sundial",
    "fox-fur hat", "walking cane", "enamel badge", "ferry ticket", "hunting horn", "sea chest",
    "pearl hairpin", "grain sack", "bronze medal", "willow basket", "glass lens", "twine bundle",
)

#: In-context classification topics: each is a set of words; an instance maps some topics to labels.
ICL_TOPICS = (
    ("glacier", "iceberg", "snowdrift", "permafrost", "avalanche", "frost", "sleet", "icicle", "blizzard",
     "tundra"),
    ("violin", "orchestra", "symphony", "conductor", "overture", "cellist", "sonata", "choir", "metronome",
     "tempo"),
    ("tractor", "harvest", "barley", "silo", "furrow", "scarecrow", "haystack", "orchard", "plough",
     "livestock"),
    ("satellite", "orbit", "rocket", "astronaut", "telescope", "nebula", "comet", "launchpad", "asteroid",
     "capsule"),
    ("invoice", "ledger", "dividend", "audit", "mortgage", "pension", "budget", "receipt", "tariff",
     "shareholder"),
    ("lighthouse", "anchor", "harbour", "trawler", "buoy", "tide", "seagull", "dock", "mooring", "sailcloth"),
    ("vaccine", "stethoscope", "clinic", "bandage", "prescription", "surgeon", "antibiotic", "ward", "pulse",
     "syringe"),
    ("goalkeeper", "penalty", "stadium", "referee", "striker", "trophy", "league", "halftime", "tackle",
     "scoreboard"),
    ("volcano", "lava", "crater", "magma", "geyser", "ash cloud", "eruption", "basalt", "fissure", "caldera"),
    ("courtroom", "verdict", "jury", "lawsuit", "testimony", "judge", "appeal", "bailiff", "subpoena",
     "plaintiff"),
    ("oven", "dough", "pastry", "whisk", "batter", "croissant", "yeast", "icing", "rolling pin", "meringue"),
    ("compiler", "database", "server", "algorithm", "keyboard", "firmware", "debugger", "router",
     "spreadsheet", "cursor"),
    ("rainforest", "jaguar", "canopy", "orchid", "toucan", "vine", "monsoon", "tree frog", "mangrove",
     "parrot"),
    ("castle", "knight", "drawbridge", "moat", "armour", "banner", "throne", "catapult", "battlement",
     "jousting"),
    ("railway", "locomotive", "platform", "timetable", "carriage", "signal box", "guard's whistle",
     "sleeper car", "junction", "ticket barrier"),
    ("museum", "curator", "exhibit", "fossil", "gallery", "artefact", "sculpture", "archive", "display case",
     "restoration"),
    ("election", "ballot", "candidate", "parliament", "campaign", "senator", "polling station", "manifesto",
     "debate", "coalition"),
    ("desert", "camel", "dune", "oasis", "cactus", "mirage", "caravan", "sandstorm", "scorpion", "nomad"),
)
ICL_TEMPLATES = (
    "Someone kept bringing up the {a} while we discussed the {b}.",
    "The notes mention the {a} right next to the {b}.",
    "In the last report, the {a} turned out to matter more than the {b}.",
    "It is a short story about the {a} and, unexpectedly, the {b}.",
    "Nobody expected the {a} to be linked with the {b}.",
    "The photo showed the {a}, and in the background the {b}.",
    "They argued for an hour about the {a} and the {b}.",
    "My cousin wrote a letter describing the {a} and the {b}.",
    "The headline was about the {a}; the article was about the {b}.",
    "First came the {a}, then everyone talked about the {b}.",
)

#: Conversational filler for dialogue chunks (no pool word in any of them).
DIALOGUE_FILLER = (
    "The bus was late again this morning, so I walked most of the way.",
    "I finally finished sorting the photos from last summer.",
    "The weather has been strange lately, sunny one hour and grey the next.",
    "I tried a new recipe for soup but it came out far too salty.",
    "My phone keeps running out of battery before the evening.",
    "I have been sleeping better since I stopped drinking coffee after lunch.",
    "The library extended its opening hours, which is a relief.",
    "I spent a while reorganising the kitchen drawers.",
    "There was a long queue at the post office today.",
    "I started reading a thick novel but I am only on the second chapter.",
    "The neighbours are renovating and the drilling starts early.",
    "I want to spend less time looking at screens in the evening.",
    "Our building finally fixed the lift after three weeks.",
    "I noticed the days are getting noticeably longer.",
    "The market had very good strawberries this week.",
    "I keep forgetting to water the plants on the balcony.",
    "Traffic near the bridge was terrible all afternoon.",
    "I watched a documentary about deep sea creatures last night.",
    "The new cafe downstairs makes decent sandwiches.",
    "I should really clean the windows before the weekend.",
    "A friend recommended a podcast about history that I enjoyed.",
    "I lost my umbrella somewhere between the office and home.",
    "The power went out for an hour in the evening.",
    "I am trying to walk at least five thousand steps every day.",
)

#: Narrative filler for reading passages (no pool word in any of them).
STORY_FILLER = (
    "The wind changed direction twice before noon.",
    "Rain tapped on the shutters for most of the evening.",
    "Nobody spoke for a long while, and the fire burned low.",
    "The road out of town was muddy after the storm.",
    "Gulls circled above the rooftops, calling to one another.",
    "A cart rattled past, loaded with crates of apples.",
    "The bakery opened late, and a small crowd gathered outside.",
    "Somewhere a dog barked, then fell silent.",
    "The sky cleared just before sunset, turning the water gold.",
    "Old stories said the hills had once been covered in forest.",
    "The innkeeper wiped the same table for the third time.",
    "Fog rolled in from the sea and hid the far shore.",
    "Children chased each other along the old stone wall.",
    "A church bell rang somewhere inland.",
    "The market square emptied as the light faded.",
    "Dew covered the fields the following morning.",
)

#: Replies and small talk of the conversation family's other speaker (no pool word in any of them).
CHAT_REPLIES = (
    "Oh nice, how is that going so far?",
    "Really? I did not expect that at all.",
    "That sounds like a lot of work, honestly.",
    "Ha, I remember you talking about that.",
    "Good for you, you deserve it.",
    "Wait, since when?",
    "I would love to hear more about it next time.",
    "Hmm, I am not sure I would have done the same.",
    "That is great news, congratulations!",
    "Sorry, I have been so busy lately, I missed that.",
    "Same here, the week went by so fast.",
    "Oh no, that does not sound fun.",
    "Let me know if you need a hand with anything.",
    "Haha, typical.",
)

#: Filler sentences of the document family's reports (no pool word in any of them).
DOCUMENT_FILLER = (
    "The methods are described in more detail in the appendix.",
    "Data were collected with the same questionnaire at every visit.",
    "The steering group met every second month to review progress.",
    "Several limitations of the design are discussed in the final section.",
    "Results were checked independently by two members of the team.",
    "The full tables are available from the authors on request.",
    "Participants could withdraw at any time without giving a reason.",
    "Costs were recorded in the currency of the year they were spent.",
    "A second phase is planned if further funding can be found.",
    "The local council supported the work with office space.",
    "Missing values were rare and were left out of the analysis.",
    "Weather delayed the field work by a few weeks in the spring.",
)

#: Kinds of project a document reports on (the project's name is a town and its kind).
PROJECT_KINDS = (
    "water quality survey", "bridge repair programme", "school meals trial", "coastal erosion study",
    "hearing screening project", "bus timetable pilot", "allotment garden scheme", "sleep clinic trial",
)
