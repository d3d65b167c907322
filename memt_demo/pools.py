"""Word pools of the synthetic demo data: the values an episode draws at random.

Every value is an ordinary word (one BPE token in the demo tokenizer, which is trained on this data), so
an episode's facts cannot be memorised in the weights: the same pools fill every episode with fresh
combinations, and the model has to carry the particular ones through latent memory.
"""

from __future__ import annotations


def _words(text: str) -> tuple[str, ...]:
    words = tuple(text.split())
    if len(set(words)) != len(words):
        raise ValueError(f"duplicate words in pool: {sorted(w for w in words if words.count(w) > 1)}")
    return words


NAMES = _words(
    """
    Alice Bob Carol David Emma Frank Grace Henry Isabel Jack Kate Liam Mia Noah Olivia Paul Quinn Rosa Sam
    Tara Uma Victor Wendy Xavier Yara Zoe Anna Ben Chloe Daniel Elena Felix Hannah Ivan Julia Kevin Laura
    Marco Nina Oscar Peter Rachel Simon Sofia Tom Vera William Yusuf Zara Ahmed Aisha Carlos Diego Fatima
    Hiro Ingrid Jonas Kenji Lucia Mateo Nadia Omar Priya Raj Sara Tariq Yuki Amir Bianca Camille Dmitri Eva
    Farah Gabriel Hugo Ines Jamal Karim Leila Maya Nora Pablo Rita Sven Theo Lena Max Leo Ella Lucas Ruby
    Adam Alex Amelia Andrea Anton Astrid Axel Bruno Caleb Clara Dario Emil Erik Ethan Finn Freya George Gina
    Hana Helen Ian Ida Iris Isaac Jade James Jana Joel Kai Kim Lara Lily Luke Maria Mark Martin Mila Nathan
    Nils Olga Otto Petra Ravi Rosie Ryan Sean Selma Tobias Ulla Vivian Walter Yasmin Zeynep Arjun Bea Cora
    Dante Edith Ezra Flora Greta Ada Hector Igor Jasper Joan Karl Lea Lorenzo Marta Mohammed Naomi Oliver
    Pedro Rafael Rosalind Ruth Silvia Stella Ted Ursula Vince Wanda Amara Boris Celia Dora Elias Fiona
    Gustav Harriet Ilse Jorge Keiko Linus Magnus Nell Orla Piotr Rhea Santiago Tessa Umar Valentina Wilma
    """
)

CITIES = _words(
    """
    Lisbon Paris London Berlin Madrid Rome Vienna Prague Oslo Stockholm Helsinki Dublin Amsterdam Brussels
    Zurich Geneva Warsaw Budapest Athens Istanbul Cairo Nairobi Lagos Accra Dakar Casablanca Tunis Mumbai
    Delhi Chennai Kolkata Bangalore Karachi Lahore Dhaka Bangkok Hanoi Manila Jakarta Singapore Seoul Busan
    Tokyo Osaka Kyoto Beijing Shanghai Shenzhen Taipei Sydney Melbourne Perth Auckland Wellington Toronto
    Montreal Vancouver Chicago Boston Seattle Denver Dallas Houston Miami Atlanta Phoenix Portland Austin
    Detroit Lima Bogota Quito Santiago Caracas Havana Tehran Dubai Doha Riyadh Beirut Amman Marseille Lyon
    Porto Seville Valencia Barcelona Milan Naples Venice Florence Munich Hamburg Cologne Frankfurt Krakow
    Riga Vilnius Tallinn Kyiv Bucharest Belgrade Zagreb Ljubljana Bratislava Copenhagen Bergen Gothenburg
    Edinburgh Glasgow Manchester Liverpool Bristol Cardiff Belfast Reykjavik Marrakesh Kigali Kampala
    Lusaka Harare Luanda Montevideo Recife Brisbane Adelaide Ottawa Calgary Quebec Kathmandu Colombo Almaty
    Tashkent Baku Tbilisi Yerevan
    """
)
CITIES = tuple(c for c in CITIES if c not in NAMES)  # "Santiago" is a name and a city: keep it a name

FOODS = _words(
    """
    sushi pizza pasta tacos curry ramen burgers dumplings paella lasagna risotto pancakes waffles noodles
    falafel hummus kebab salad soup steak chocolate cheese bread rice couscous burritos nachos omelettes
    croissants bagels donuts cake pie pudding gnocchi ravioli spaghetti tofu tempura kimchi bibimbap pho
    samosas biryani goulash borscht pierogi schnitzel sausages fries popcorn mangoes strawberries apples
    bananas cherries grapes watermelon pineapple peaches avocados mushrooms lentils chili fajitas
    enchiladas quesadillas gyoza udon lobster shrimp oysters salmon tuna sardines yogurt muffins cookies
    brownies tiramisu baklava churros crepes fondue quiche
    """
)

ANIMALS = _words(
    """
    cat dog rabbit hamster parrot turtle goldfish snake lizard horse pony ferret mouse rat hedgehog canary
    duck goat pig chicken frog spider iguana chinchilla gecko owl tortoise budgie kitten puppy
    """
)

JOBS = _words(
    """
    teacher doctor nurse engineer lawyer chef pilot farmer baker dentist painter writer musician singer
    actor dancer plumber electrician carpenter architect scientist programmer designer journalist
    photographer librarian pharmacist accountant firefighter mechanic waiter barista tailor gardener
    driver cashier translator surgeon veterinarian astronaut banker economist historian biologist chemist
    physicist student professor judge sailor fisherman butcher florist
    """
)

TRAITS = _words(
    """
    kind curious shy brave funny patient calm cheerful honest lazy clever creative friendly generous grumpy
    loyal polite quiet serious stubborn talkative gentle bold careful clumsy humble nervous optimistic
    proud relaxed sensible silly tidy messy ambitious energetic modest witty thoughtful confident
    """
)

COLOURS = _words(
    """
    red blue green yellow purple orange pink black white grey brown teal gold silver violet turquoise
    maroon navy beige crimson indigo lavender
    """
)

HOBBIES = _words(
    """
    chess painting hiking swimming cycling running reading gardening cooking baking fishing dancing singing
    knitting photography surfing skiing climbing yoga tennis football basketball golf drawing pottery
    sailing camping juggling origami archery boxing karate rowing skating birdwatching woodworking
    """
)

MONTHS = _words("January February March April May June July August September October November December")

AGES = tuple(str(n) for n in range(16, 91))

# Documents: a company profile.
ORG_WORDS = _words(
    """
    Acme Nova Orbit Zenith Apex Vertex Quantum Pioneer Summit Horizon Atlas Nimbus Polaris Titan Echo Vector
    Helix Fusion Sterling Cobalt Falcon Harbor Maple Cedar Aurora Granite Willow Comet Beacon Lotus Meridian
    Prism Quartz Raven Sparrow Tundra Vortex Juniper Onyx Pebble
    """
)
ORG_KINDS = _words("Labs Systems Foods Motors Books Games Tools Energy Studios Works Robotics Textiles")
PRODUCTS = _words(
    """
    bicycles phones shoes toys chairs lamps robots cameras watches boats tea coffee software tents guitars
    pianos umbrellas backpacks kites candles drones helmets jackets paint rockets scooters sofas speakers
    tractors windows
    """
)
FILLER_SENTENCES = (
    "The office is open every weekday.",
    "Many customers like its friendly service.",
    "The building has a small garden on the roof.",
    "Visitors can take a tour on Fridays.",
    "The team meets every Monday morning.",
    "Its website is updated every month.",
    "The company sponsors a local football club.",
    "Most workers come to the office by bicycle.",
    "A new branch will open next year.",
    "It won a design prize last spring.",
    "The canteen serves lunch at noon.",
    "Its first shop was very small.",
)

# Tools.
CONDITIONS = _words("sunny cloudy rainy windy snowy foggy stormy clear")

# Repetition texts: sentence starters (the first word is unspaced in the answer) and a general pool.
STARTERS = _words(
    """
    The A My I We You They It This That Please Today Tomorrow Yesterday Every Some Our Your His Her Maybe
    Never Always Once When If After Before
    """
)
COMMON_WORDS = _words(
    """
    the a an and or but of to in on at for with from by about over under after before is are was were be
    have has had do does did can will would should could may might must not very really quite just also
    only still again here there now then today tomorrow yesterday always never often sometimes big small
    old new good bad happy sad fast slow hot cold warm cool bright dark long short early late red blue green
    house car tree river mountain garden window door table chair book letter song story road city village
    train boat plane bird fish dog cat horse flower sun moon star rain snow wind cloud water fire stone
    friend family mother father sister brother child teacher doctor king queen music picture game ball
    walk run jump swim sing dance read write cook eat drink sleep play work open close find make take give
    see hear know think want like love need help call
    """
)

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are MemT, a small assistant with latent memory.",
    "Answer briefly.",
    "You are a friendly assistant. Keep answers short.",
    "Be concise and polite.",
)

FOOD_ADJECTIVES = _words("small fresh spicy sweet grilled fried baked cold warm crispy roasted tiny salty smoked")

# Held out: real names and cities that training never draws (the evaluation's held-out split uses them).
HELDOUT_NAMES = _words(
    """
    Siobhan Bartholomew Xiomara Quentin Ottilie Ximena Joaquin Dagny Radomir Wojciech Aoife Thandiwe
    Oluwaseun Beatrix Cosima Leopold Svetlana Yevgenia Anneliese Bogdan Zbigniew Mireille Ignatius Philippa
    Horatio Evangeline Cuthbert Gwendolyn Thaddeus Ludmila Casimir Florentina Desmond Henrietta Kazimierz
    Aurelio Brunhilde Cressida Eustace Fenella Gideon Imogen Jolanta Lysander Marisol Nikodem Octavia
    Peregrine Rosalba Sigrun Tancredi Wilhelmina Yolanda Zenobia Anastasio Bronwyn Crispin Dolores Ebenezer
    """
)
HELDOUT_CITIES = _words(
    """
    Ouagadougou Valparaiso Thessaloniki Antananarivo Chisinau Ulaanbaatar Paramaribo Nouakchott Bujumbura
    Timbuktu Samarkand Bukhara Trondheim Tromso Innsbruck Salzburg Ljubinje Maastricht Groningen Antwerp
    Bruges Ghent Coimbra Braga Cordoba Granada Bilbao Toulouse Bordeaux Strasbourg Nantes Dresden Leipzig
    Heidelberg Wroclaw Gdansk Poznan Brno Debrecen Szeged Plovdiv Varna Podgorica Sarajevo Skopje Tirana
    Windhoek Gaborone Maputo Lilongwe Asmara Djibouti Mogadishu Kinshasa Brazzaville Yaounde Niamey
    Bamako Conakry Freetown Monrovia Mendoza Rosario Cusco Arequipa Medellin Cali Guayaquil Asuncion
    """
)
_overlap = (set(HELDOUT_NAMES) | set(HELDOUT_CITIES)) & (set(NAMES) | set(CITIES) | set(ORG_WORDS) | set(COMMON_WORDS))
if _overlap:
    raise ValueError(f"held-out words also in training pools: {sorted(_overlap)}")
