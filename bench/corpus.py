"""Deterministic generator of a docs-site-like markdown corpus, for benchmarks.

    python bench/corpus.py OUT_DIR --files 5000 --seed 1

Each file is built from its own `random.Random(seed, index)` stream, so the same
(seed, files) always gives byte-identical files whatever the machine, and file N is
the same whether 100 or 5000 files are generated.

What a file looks like: optional YAML frontmatter (~30%), an H1, H2/H3 sections of
paragraphs drawn from a fixed vocabulary (function words first, then a few thousand
English and technical words in a seeded Zipf-like order, plus fixed two-word
collocations such as "connection pool"), inline code, links to sibling pages and to
external sites, bulleted and numbered lists, tables, block quotes and fenced code in
several languages. Sizes are log-normal (median ~4 KB, mean ~6.5 KB, ~0.5% over
50 KB, capped at 400 KB). Folders nest 1-4 levels under a dozen top-level sections.

Usable from other scripts: `generate(out_dir, files=..., seed=...)` returns a
`CorpusStats`; `make_document(index, seed)` returns one file's text.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# -- vocabulary -------------------------------------------------------------------

# The most frequent words of English prose, roughly in frequency order: they keep their
# rank (the head of the Zipf curve), as in real text.
FUNCTION_WORDS = """
the of and to a in is that for it as with was on be by this are or from at an
which can not but have you has will if all one they their more when we there also
been so what about would into other than its only some these them then use may
each any such should how most could do does where after before over between both
many very just because while through under during without same every those here
""".split()

_COMMON = """
able access account across action active activity actual add added addition address
adjust advance advice affect agent agree ahead aim alert allow almost alone along
already alternative although always amount analysis announce annual answer anyone
anything appear application apply approach appropriate approve area argue around
arrange arrive article aside ask aspect assess assign assume attach attempt attend
attention audience author automatic available average avoid aware away back balance
base basic basis become begin behavior behind believe belong below benefit best
better beyond big bill bit block board body book border borrow bottom box brief
bring broad budget build burden business busy buy call campaign capable capacity
capital care career careful carry case catch category cause center central certain
chain challenge chance change chapter character charge cheap check choice choose
circle claim clarify class classic clean clear client close closely coach code
collect collection color column combine come comfort command comment commit common
community company compare complete complex component concept concern condition
conduct confirm conflict connect consider consistent constant construct consult
contact contain content context continue contract contrast contribute control
convert copy core corner correct cost count country couple course cover create
credit critical cross crowd culture current customer cycle daily damage data date
deal debate decade decide decision deep default defend define degree delay deliver
demand depend deploy describe design desk detail detect determine develop device
differ different difficult direct direction discover discuss display distance
divide document domain double doubt down draft draw drive drop due early earn easy
economy edge edit effect effort either element else emerge emphasis employee enable
encourage end energy engage engine enough ensure enter entire entry environment
equal error escape especially essential establish estimate even event eventually
evidence exact example exceed exchange exist expand expect experience expert explain
explore express extend extra face fact factor fail fair fall familiar far fast
feature feed feel few field figure file fill final finance find fine finish firm
first fit fix flat flexible flow focus follow force form format forward foundation
frame free frequent fresh friend front full function fund future gain gap gather
general generate give global goal good grant great green ground group grow growth
guard guess guide habit half hand handle happen hard head health hear heavy help
high highlight history hold home hope host hour house huge human idea identify
ignore image impact implement important improve include income increase indeed
independent indicate individual industry inform initial input inside insight
instance instead intend interest internal interview introduce invest involve issue
item join judge jump keep key kind know knowledge label labor lack language large
last late launch layer lead learn least leave left legal length less lesson letter
level library light likely limit line link list listen little live load local
location logic long look loss low machine main maintain major make manage manager
manual map margin mark market master match material matter maximum mean measure
media meet member memory mention merge message method middle might minimum minor
minute miss mistake mix mode model modern modify moment money month morning move
much multiple name narrow native natural near necessary need negative network never
new next night normal note notice number object observe obtain obvious occur offer
office often old once open operate opinion option order ordinary organize origin
original outcome output outside overall owner page pair panel paper parent part
particular partner pass past path pattern pay peak people percent perform perhaps
period permit person phase phone pick piece place plan platform play point policy
popular portion position positive possible post potential power practice prefer
prepare present press pressure pretty prevent previous price primary principle
print prior priority private probably problem process produce product profile
program progress project promise proper property propose protect provide public
publish pull purpose push quality question quick quiet quite raise range rate rather
reach read ready real reason receive recent record reduce refer reflect region
regular reject relate release relevant rely remain remember remove repeat replace
reply report represent request require research reserve resolve resource respond
response rest result retain return reveal review reward rich right rise risk role
room root rough round route rule run safe sale sample save scale scan schedule scope
score screen search season second section secure see seek select self sell send
sense separate sequence series serve service session set setting several shape share
shift short show side sign signal significant similar simple single site size skill
slow small smart social soft solid solution solve sort source space speak special
specific speed spend split spread staff stage stand standard start state statement
status stay step still stock stop store story strategy stream strong structure study
style subject submit success suggest summary supply support sure surface survey
switch system table take talk target task team technical technique tell tend term
test text thank theory thing think third though thought threshold through tie time
title today together tool top topic total touch toward track trade traffic train
transfer travel treat trend trial trigger trouble true trust try turn type typical
unit unless until update upgrade upper usage useful user usual valid value variable
variety various version view visible visit voice volume wait walk want warn watch
way week weight well whole wide window wish within word work worker world worth
write wrong year yield young zone
""".split()

_TECHNICAL = """
abstraction accessor acknowledgment adapter aggregate algorithm alias allocation
allocator annotation anomaly api appender archive argument array artifact assertion
async asynchronous atomic attribute audit authentication authorization autoscaling
availability backend backoff backpressure backup bandwidth baseline batch benchmark
binary binding bitmap blob bootstrap boundary branch breakpoint broker browser bucket
buffer bug bundle bytecode cache callback canary certificate changelog channel
checkpoint checksum chunk cipher classpath cli clock cluster codec collation collector
compaction compiler compression concurrency config configuration connector consensus
console constraint consumer container controller cookie coordinator coroutine cpu
credential cron cryptography cursor daemon dashboard database dataset deadlock
debugger decoder decorator dependency deployment deprecation deserialize descriptor
digest directory disk dispatcher distributed dns docker dockerfile driver durability
embedding encoder encryption endpoint enum ephemeral eviction exception executor
exporter expression extension failover fallback fetch filesystem filter firewall
firmware flag fork formatter fragment framework frontend gateway generator getter git
gradient graph grpc handler handshake hash hashing header heap heartbeat helper hook
hostname http https hypervisor identifier idempotent immutable import index indexer
inference inheritance initializer inode instance instrumentation integer integration
interceptor interface interpreter invariant iterator json jwt kernel keystore
kubernetes lambda latency leader lease lexer lifecycle linker linter listener loader
lock lockfile logger logging lookup loop manifest mapper markdown marshal matrix
metadata metric microservice middleware migration mirror mock module monitor mount
mutex namespace node nonce notebook null oauth observability offset orchestration
orm package packet pagination parser partition passphrase patch payload peer
permission persistence pipeline pixel placeholder plugin pod pointer polling pool
port predicate prefetch prefix preprocessor probe processor producer profiler prompt
protocol provisioning proxy publisher query queue quorum quota rebase recursion redis
redirect refactor reference regex registry regression renderer replica replication
repository resolver retry revision rollback rollout router runtime sandbox scheduler
schema scraper script sdk secret selector semaphore serializer server serverless
setter shard sharding shell sidecar signature singleton snapshot socket sql stack
staging stateful stateless storage subnet subprocess subscriber suffix superuser
symlink sync synchronous syntax syscall tag tarball telemetry template tenant
terminal thread throttle throughput timeout timestamp tls token tokenizer topology
trace tracing transaction transform transport tree tuple typescript uri url utf
validation validator vector vendor virtualization volume vulnerability webhook
websocket whitelist widget wildcard workflow workload workspace wrapper yaml
python rust golang java javascript kotlin swift ruby postgres mysql sqlite mongodb
kafka rabbitmq nginx apache linux macos windows ubuntu debian alpine terraform
ansible helm grafana prometheus jaeger elasticsearch opensearch react vue angular
svelte django flask fastapi express spring rails laravel pytest jest cargo npm pip
maven gradle webpack vite babel eslint prettier mypy ruff clippy systemd launchd
nodejs deno bun wasm webassembly graphql rest soap protobuf avro parquet csv xml
toml ini utf8 ascii unicode base64 sha256 md5 hmac rsa ecdsa aes gzip zstd brotli
lz4 tcp udp ipv4 ipv6 ssh ftp smtp imap ldap saml oidc sso mfa cors csrf xss ssrf
""".split()

_WORDS_EXTRA = """
absence abundance academic accent accident accuracy achieve acquire adapt adequate
adopt adult advantage adventure advertise afford afternoon agency agenda aggressive
airline airport alarm album alcohol alliance ally alter amazing ambition amend
ancient anger angle animal ankle anniversary anxiety apart apology apparent appeal
appetite applause appoint appreciate approval arbitrary architect argument arise
armed arrival arrow artist assembly asset assist associate assure athlete atmosphere
attitude attorney attract auction authority autumn award awkward baby bag bake ball
ban band bank bar bare barely barrier basket battery battle beach bean bear beat
beauty bedroom beer beg bell belt bench bend bet bias bicycle bike bind biology bird
birth bite bitter blade blame blank blast blend bless blind blood blow blue boat
boil bold bomb bond bone bonus boost boot boss bother bottle bounce bowl brain brand
brave bread breakfast breath breed brick bride bridge bright brilliant broken brother
brush bubble buddy bunch burn burst bury butter button cabin cable cake calculate
calendar calm camera camp canal cancel cancer candidate candle cap captain capture
carbon cargo carpet cart cash castle casual cattle ceiling celebrate cell cement
census ceremony chair chairman champion chaos charity chart chase chat cheese chef
chemical chest chicken chief child chip chocolate chord chronic church cigarette
cinema citizen city civil clerk clever cliff climate climb clinic cloth cloud club
cluster coal coast coat coffee coin cold collapse colleague college colony comedy
comic commerce commission committee companion comparison compete complaint compose
compound comprise compute conceal conceive concert conclude concrete confess
confident confuse congress conscious consent conserve constitute consume contest
convince cook cool cooperate cope corn corporate corridor cottage cotton council
counsel counter county courage court cousin craft crash crazy cream creature crew
crime crisis criteria crop crucial cruel crush cry crystal cultivate cup cure
curious curtain curve cushion custom cute dance danger dare dark daughter dawn dead
dear debt decline decorate dedicate defeat defect deficit delicate delight democracy
demonstrate dense dentist deny depart deposit depress derive desert deserve desire
desperate dessert destroy detective diagnose dialogue diamond diary diet digital
dignity dilemma dimension dinner diplomat dirt disaster discipline discount disease
dish dismiss disorder dispute distinct distribute district disturb dive diverse
doctor dog dollar donate door dose dozen drag drama dream dress drink dry duck dull
dust duty eager ear earth ease east eat echo ecology editor educate egg elbow elder
elect elegant elephant eliminate embrace emotion empire empty encounter enemy
enforce enormous enterprise entertain enthusiasm episode equip era erode essay
estate eternal ethics evaluate evening evil evolve exam excellent excess excite
exclude excuse execute exercise exhibit exile exotic expense explode exploit export
expose extent extreme fabric facility faculty faith fake fame family fan fancy farm
fashion fat fate father fault favor fear feast federal fee female fence festival
fever fiction fight film finger fire fish flame flash fleet flesh flight float flood
floor flour flower fluid fly fog fold folk food foot forest forget forgive fork
formal formula fortune fossil foster fraction fragile frank fraud freedom freeze
freight frequency fridge frog fruit fuel fun funny furniture galaxy gallery game
garage garden garlic gas gate gaze gender gene genius genre gentle genuine gesture
ghost giant gift girl glad glance glass globe glory glove glue golden golf gorgeous
govern grab grace grade grain grand grape grass grateful grave gravity grief grin
grip grocery guarantee guest guilt guitar gun guy hair hall hammer harbor harm
harvest hat hate hazard heal heart heat heaven height hero hesitate hide highway
hill hint hip hire hobby holiday hollow holy honest honey honor horizon horn horror
horse hospital hotel hunger hunt hurry hurt husband ice icon ideal identity illness
illusion imagine immense immune import impose impress impulse incident incline
inflation injury inner innocent innovation inquiry insect insist inspect inspire
install instinct institute insult insurance intact intellect intense interior
interpret interval invade invent invite iron island jacket jail jazz jealous jet
jewel job joint joke journal journey joy juice jungle junior jury justice kick kid
kidney king kiss kitchen knee knife knock lab ladder lady lake lamp land landscape
lane laptop laser laugh law lawn lawyer lazy leaf league lean leather lecture leg
legacy legend leisure lemon lend liberal lid lift lime lion lip liquid literature
liver loan lobby logo lonely loose lord lottery loud lounge love loyal luck lunch
luxury magazine magic magnet mail mammal mansion marble marine marriage mask mass
meal meat medal medicine melody melt membership mental menu mercy merit mess metal
midnight mild military milk mind mineral minister miracle mirror misery mission
mobile moderate modest molecule monkey monster mood moon moral mortgage mother motion
motor mountain mouse mouth movie mud murder muscle museum music mystery myth nail
naked nation nature neck negotiate neighbor nephew nerve nest neutral news noble
noise nominate north nose novel nuclear nurse nut oak obey occasion ocean odd offend
officer oil olive opera opponent oppose orange orbit organ ought outfit oven owe
oxygen pace pack pain paint palace palm pan paradise parade parallel parking
parliament passage passenger passion pasta patience patient pause peace pen penalty
pencil pension pepper perfect permanent persuade pet phrase physical piano picture
pie pig pile pilot pin pine pink pipe pit pitch pity pizza plane planet plant plastic
plate pleasure plenty pocket poem poet poison pole police polite politics pond poor
pop portrait pose possess pot potato pound pour poverty praise pray predict pregnant
premium presence preserve president prevail pride priest prince prison prize profit
prohibit prominent proof prospect proud prove province pump punch punish pupil puppy
purchase purple puzzle qualify queen quit quote rabbit race racism radio rail rain
rank rapid rare raw razor realm rear rebel recall recipe recover recruit red reform
refuse regret reinforce relax relief religion reluctant remark remedy remind remote
rent repair rescue resemble resident resign resist respect restaurant restore retire
retreat revenue reverse revolution rhythm rice ride ridge rifle ring riot ripe rival
river road robot rock rocket romance roof rope rose rotate rub rude ruin rural rush
sacred sad saddle sail salad salary salmon salt sand satellite satisfy sauce scandal
scare scene scholar school science scratch sculpture sea seat secretary seed segment
seize senate senior sensation sentence sentiment servant settle severe sex shadow
shake shallow shame sheep sheet shelf shell shelter shield shine ship shirt shock
shoe shoot shop shore shoulder shout shy sick silence silk silver sing sink sister
sketch ski skin skirt sky slave sleep slice slide slim slip slope smell smile smoke
smooth snake snap snow soap soccer sock sofa soil soldier sole son song soul sound
soup south spare spark speech spell spice spider spin spirit spite splendid sponsor
spoon sport spot spouse spring spy square squeeze stable stadium stair stake stamp
star stare steady steak steal steam steel steep stem stick stiff sting stir stomach
stone storm straight strange straw street stretch strict strike string strip stroke
struggle student stuff stupid submarine substance suburb subway succeed sudden
suffer sugar suicide suit sum summer summit sun super supreme surgeon surprise
surround suspect sustain swallow swear sweat sweep sweet swim swing sword symbol
sympathy symptom tablet tactic tail tale talent tank tape taste tax tea teach tear
teen telescope temple tempt tenant tender tennis tension tent territory terror thick
thief thin threat throat throne thumb ticket tide tiger tight timber tiny tip tire
tissue tobacco toe toilet tomato tone tongue tooth torch tornado tough tour tourist
towel tower town toy trace tragedy trail trap trash treasure treaty tribe trick trip
troop truck trumpet tube tunnel twin twist ugly umbrella uncle undergo unfold uniform
union unique universe university upset urban urge utility vacation vaccine valley van
vast vegetable vehicle venture verdict verse vessel veteran victim victory video
village vintage violence violin virtue virus vision vital vitamin vivid vocal
volunteer vote voyage wage wagon waist wake wall wander war warm wash waste water
wave wealth weapon wear weather wedding weekend welcome west wet whale wheat wheel
whisper white widow wife wild win wind wine wing winner winter wipe wire wisdom
witness wolf woman wonder wood wool worry wound wrap wrist yard yellow youth zero
""".split()

# Verbs that also appear inflected (-s, -ed, -ing), as in real prose.
_VERBS = """
access add allow apply build cache call change check clear collect commit compile
configure connect create debug define delete deploy describe detect enable expect
export fail fetch filter handle import include index install load lock log merge
migrate monitor move open parse pass process publish pull push query read receive
record release remove render replace report request require resolve restart return
run save scale search send serve start stop store stream sync test track train
update upgrade upload validate watch work write
""".split()

# Two-word phrases that occur as units in technical docs (phrase queries find them).
COLLOCATIONS = [
    "connection pool",
    "rate limit",
    "access token",
    "error handling",
    "load balancer",
    "health check",
    "feature flag",
    "garbage collection",
    "service mesh",
    "message queue",
    "primary key",
    "foreign key",
    "unit test",
    "integration test",
    "code review",
    "pull request",
    "release notes",
    "command line",
    "environment variable",
    "config file",
    "web server",
    "file system",
    "data model",
    "search index",
    "full text",
    "cache invalidation",
    "race condition",
    "memory leak",
    "stack trace",
    "exit code",
    "status code",
    "request body",
    "response time",
    "time zone",
    "user interface",
    "background job",
    "retry policy",
    "circuit breaker",
    "dead letter",
    "read replica",
    "write ahead",
    "hot path",
    "cold start",
    "warm cache",
    "batch size",
    "thread pool",
    "event loop",
    "type hint",
    "virtual environment",
    "package manager",
    "build system",
    "continuous integration",
    "dependency injection",
    "single sign",
    "public key",
    "private key",
    "secret manager",
    "audit log",
    "access control",
    "role based",
    "query planner",
    "vector search",
    "embedding model",
    "context window",
    "token budget",
    "machine learning",
    "neural network",
    "training data",
    "test suite",
    "golden file",
    "breaking change",
    "semantic version",
    "migration guide",
    "quick start",
    "best practice",
    "open source",
    "pricing plan",
    "support ticket",
    "incident report",
    "on call",
]


def _inflect(verb: str) -> list[str]:
    if verb.endswith("e"):
        return [verb + "s", verb + "d", verb[:-1] + "ing"]
    if verb.endswith(("s", "sh", "ch", "x")):
        return [verb + "es", verb + "ed", verb + "ing"]
    return [verb + "s", verb + "ed", verb + "ing"]


def _content_vocabulary() -> list[str]:
    seen = set(FUNCTION_WORDS)
    out: list[str] = []
    for word in itertools.chain(
        _COMMON, _TECHNICAL, _WORDS_EXTRA, itertools.chain.from_iterable(_inflect(v) for v in _VERBS)
    ):
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


CONTENT_WORDS = _content_vocabulary()


class Vocabulary:
    """Words ranked for a Zipf-ish draw: P(rank r) ~ 1 / (r + 2.7). Function words hold the
    top ranks; the content words follow in an order fixed by the seed, so which technical
    words are common differs between seeds but never between runs."""

    def __init__(self, seed: int) -> None:
        content = list(CONTENT_WORDS)
        random.Random(f"qmd-bench-vocab-{seed}").shuffle(content)
        self.words = FUNCTION_WORDS + content
        weights = [1.0 / (r + 2.7) for r in range(len(self.words))]
        self.cum = list(itertools.accumulate(weights))
        self.total = self.cum[-1]
        self.content = content
        content_weights = [1.0 / (r + 10.0) for r in range(len(content))]
        self.content_cum = list(itertools.accumulate(content_weights))

    def draw(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def content_draw(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.content, cum_weights=self.content_cum, k=k)


_VOCABS: dict[int, Vocabulary] = {}


def vocabulary(seed: int) -> Vocabulary:
    if seed not in _VOCABS:
        _VOCABS[seed] = Vocabulary(seed)
    return _VOCABS[seed]


# -- documents ----------------------------------------------------------------------

SECTIONS = [
    "guide",
    "reference",
    "api",
    "tutorials",
    "concepts",
    "how-to",
    "operations",
    "blog",
    "releases",
    "faq",
    "integrations",
    "internals",
]
CODE_LANGS = ["python", "bash", "json", "yaml", "javascript", "go", "sql", "toml", "text"]
SITES = ["example.com", "docs.example.org", "github.com/example/project", "wiki.example.net"]
MEDIAN_BYTES = 3600
SIGMA = 1.0
MAX_BYTES = 400_000


def _doc_rng(seed: int, index: int) -> random.Random:
    return random.Random(seed * 1_000_003 + index)


def target_size(rng: random.Random) -> int:
    """Log-normal: median ~4 KB, mean ~6.6 KB, ~0.6% above 50 KB, capped at 400 KB."""
    return int(min(MAX_BYTES, max(300, rng.lognormvariate(math.log(MEDIAN_BYTES), SIGMA))))


def _title(rng: random.Random, vocab: Vocabulary, lo: int = 2, hi: int = 6) -> str:
    words = vocab.content_draw(rng, rng.randint(lo, hi))
    return " ".join(w.capitalize() if i == 0 or len(w) > 3 else w for i, w in enumerate(words))


def _slug(words: list[str]) -> str:
    return "-".join(words)


def _sentence(rng: random.Random, vocab: Vocabulary, links: list[str]) -> str:
    words = vocab.draw(rng, rng.randint(6, 24))
    roll = rng.random()
    if roll < 0.25:
        words.insert(rng.randrange(len(words) + 1), rng.choice(COLLOCATIONS))
    elif roll < 0.35:
        i = rng.randrange(len(words))
        words[i] = f"`{words[i]}_{rng.choice(vocab.content)}`"
    elif roll < 0.42 and links:
        i = rng.randrange(len(words))
        words[i] = f"[{words[i]}]({rng.choice(links)})"
    elif roll < 0.46:
        i = rng.randrange(len(words))
        words[i] = f"**{words[i]}**"
    elif roll < 0.48:
        i = rng.randrange(len(words))
        words[i] = f"[{words[i]}](https://{rng.choice(SITES)}/{rng.choice(vocab.content)})"
    text = " ".join(words)
    end = "?" if rng.random() < 0.05 else "."
    return text[0].upper() + text[1:] + end


def _paragraph(rng: random.Random, vocab: Vocabulary, links: list[str]) -> str:
    return " ".join(_sentence(rng, vocab, links) for _ in range(rng.randint(2, 7)))


def _code_block(rng: random.Random, vocab: Vocabulary) -> str:
    lang = rng.choice(CODE_LANGS)
    lines = []
    for _ in range(rng.randint(3, 18)):
        a, b, c = vocab.content_draw(rng, 3)
        if lang == "python":
            lines.append(
                rng.choice(
                    [
                        f"{a}_{b} = {c}({a}, timeout={rng.randint(1, 60)})",
                        f"def {a}_{b}(self, {c}):",
                        f"    return self.{a}.{b}({c})",
                        f"from {a} import {b}",
                        f"# {a} {b} {c}",
                    ]
                )
            )
        elif lang == "bash":
            lines.append(
                rng.choice(
                    [
                        f"{a} --{b} {c}",
                        f"export {a.upper()}_{b.upper()}={c}",
                        f"cd {a}/{b} && make {c}",
                        f"# {a} the {b}",
                    ]
                )
            )
        elif lang == "json":
            lines.append(f'  "{a}_{b}": "{c}",')
        elif lang == "yaml":
            lines.append(rng.choice([f"{a}:", f"  {b}: {c}", f"  - {a}-{b}"]))
        elif lang == "sql":
            lines.append(f"SELECT {a}, {b} FROM {c} WHERE {a} = {rng.randint(1, 999)};")
        elif lang in ("javascript", "go"):
            lines.append(
                rng.choice(
                    [
                        f"const {a}{b.capitalize()} = await {c}({a});",
                        f"if err := {a}.{b.capitalize()}(); err != nil {{",
                        f"  return {c}",
                        "}",
                    ]
                )
            )
        else:
            lines.append(f"{a} {b} {c}")
    if lang == "json":
        lines = ["{", *lines, "}"]
    return f"```{lang}\n" + "\n".join(lines) + "\n```"


def _list_block(rng: random.Random, vocab: Vocabulary, links: list[str]) -> str:
    ordered = rng.random() < 0.35
    items = []
    for i in range(rng.randint(3, 8)):
        text = " ".join(vocab.draw(rng, rng.randint(3, 14)))
        if rng.random() < 0.15 and links:
            text = f"see [{_title(rng, vocab, 1, 3)}]({rng.choice(links)}) for {text}"
        items.append(f"{i + 1}. {text}" if ordered else f"- {text}")
    return "\n".join(items)


def _table_block(rng: random.Random, vocab: Vocabulary) -> str:
    cols = rng.randint(2, 4)
    head = vocab.content_draw(rng, cols)
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * cols]
    for _ in range(rng.randint(2, 8)):
        rows.append("| " + " | ".join(f"`{w}`" if j == 0 else w for j, w in enumerate(vocab.draw(rng, cols))) + " |")
    return "\n".join(rows)


def _quote_block(rng: random.Random, vocab: Vocabulary) -> str:
    kind = rng.choice(["Note", "Warning", "Tip", ""])
    text = _sentence(rng, vocab, [])
    return f"> **{kind}:** {text}" if kind else f"> {text}"


def _frontmatter(rng: random.Random, vocab: Vocabulary, title: str, index: int) -> str:
    tags = ", ".join(vocab.content_draw(rng, rng.randint(1, 4)))
    return (
        f"---\ntitle: {title}\ndescription: {' '.join(vocab.draw(rng, rng.randint(6, 16)))}\n"
        f"tags: [{tags}]\ndate: 20{rng.randint(18, 26):02d}-{rng.randint(1, 12):02d}-"
        f"{rng.randint(1, 28):02d}\nweight: {index % 100}\n---\n\n"
    )


def make_document(index: int, seed: int = 1, links: list[str] | None = None) -> str:
    """The text of file `index`: deterministic in (index, seed, links)."""
    rng = _doc_rng(seed, index)
    vocab = vocabulary(seed)
    links = links or []
    size = target_size(rng)
    title = _title(rng, vocab)
    parts = [_frontmatter(rng, vocab, title, index) if rng.random() < 0.3 else "", f"# {title}\n"]
    parts.append("\n" + _paragraph(rng, vocab, links) + "\n")
    used = sum(len(p) for p in parts)
    while used < size:
        level = "##" if rng.random() < 0.7 else "###"
        block = [f"\n{level} {_title(rng, vocab, 1, 5)}"]
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.55:
                block.append(_paragraph(rng, vocab, links))
            elif roll < 0.72:
                block.append(_code_block(rng, vocab))
            elif roll < 0.88:
                block.append(_list_block(rng, vocab, links))
            elif roll < 0.95:
                block.append(_table_block(rng, vocab))
            else:
                block.append(_quote_block(rng, vocab))
        text = "\n\n".join(block) + "\n"
        parts.append(text)
        used += len(text)
    return "".join(parts)


# -- layout ---------------------------------------------------------------------------


def layout(files: int, seed: int = 1) -> list[str]:
    """Relative paths of `files` markdown files in nested folders (deterministic)."""
    rng = random.Random(f"qmd-bench-layout-{seed}-{files}")
    vocab = vocabulary(seed)
    n_dirs = max(1, files // 14)
    dirs: list[str] = [s for s in SECTIONS[: max(1, min(len(SECTIONS), n_dirs))]]
    depth = {d: 1 for d in dirs}
    while len(dirs) < n_dirs:
        parent = rng.choice(dirs)
        if depth[parent] >= 4:
            continue
        child = f"{parent}/{_slug(vocab.content_draw(rng, rng.randint(1, 2)))}"
        if child in depth:
            continue
        dirs.append(child)
        depth[child] = depth[parent] + 1
    # Folder sizes are uneven, like a real site: a few big folders, many small ones.
    weights = [rng.paretovariate(1.2) for _ in dirs]
    cum = list(itertools.accumulate(weights))
    taken: set[str] = set()
    paths: list[str] = []
    for d in dirs:  # every folder gets an index page
        if len(paths) >= files:
            break
        name = f"{d}/{'index.md' if rng.random() < 0.8 else 'README.md'}"
        taken.add(name)
        paths.append(name)
    while len(paths) < files:
        d = dirs[bisect.bisect_left(cum, rng.random() * cum[-1])]
        name = f"{d}/{_slug(vocab.content_draw(rng, rng.randint(1, 4)))}.md"
        if name in taken:
            continue
        taken.add(name)
        paths.append(name)
    return paths


def _relative_link(src: str, dst: str) -> str:
    return os.path.relpath(dst, os.path.dirname(src) or ".")


# -- whole corpus ---------------------------------------------------------------------


@dataclass
class CorpusStats:
    root: Path
    files: int
    bytes: int
    seconds: float
    paths: list[str] = field(default_factory=list)
    largest: int = 0
    over_50k: int = 0

    @property
    def mb(self) -> float:
        return self.bytes / 1e6


def cap_document(text: str, max_chars: int) -> str:
    """`text` cut before the last section heading that starts within `max_chars`, so the
    cut never splits a code fence, a table or a list; a document whose first section
    already exceeds `max_chars` keeps that section whole."""
    if len(text) <= max_chars:
        return text
    cut = 0
    for m in _SECTION.finditer(text):
        if m.start() > max_chars:
            break
        cut = m.start()
    if cut == 0:
        m = _SECTION.search(text)
        cut = m.start() if m else len(text)
    return text[:cut] + "\n"


_SECTION = re.compile(r"\n(?=#{2,3} )")


def generate(
    out_dir: str | os.PathLike[str], files: int = 5000, seed: int = 1, max_chars: int | None = None
) -> CorpusStats:
    """Write the corpus under `out_dir` (created; existing files with the same names are
    overwritten, others are left alone). Returns what was written. `max_chars` caps
    each file with `cap_document` (for benchmarks that need a small corpus, e.g. embedding)."""
    t0 = time.perf_counter()
    root = Path(out_dir)
    paths = layout(files, seed)
    total = largest = over = 0
    link_rng = random.Random(f"qmd-bench-links-{seed}-{files}")
    made: set[Path] = set()
    for i, rel in enumerate(paths):
        links = [_relative_link(rel, link_rng.choice(paths)) for _ in range(4)]
        links.append(_relative_link(rel, link_rng.choice(paths)) + f"#{link_rng.choice(CONTENT_WORDS)}")
        text = make_document(i, seed, links)
        if max_chars is not None:
            text = cap_document(text, max_chars)
        data = text.encode("utf-8")
        p = root / rel
        if p.parent not in made:
            p.parent.mkdir(parents=True, exist_ok=True)
            made.add(p.parent)
        p.write_bytes(data)
        total += len(data)
        largest = max(largest, len(data))
        over += len(data) > 50_000
    return CorpusStats(root, len(paths), total, time.perf_counter() - t0, paths, largest, over)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out_dir")
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-chars", type=int, default=None, help="cap each file at a section boundary")
    args = ap.parse_args(argv)
    if args.files < 1:
        ap.error("--files must be at least 1")
    s = generate(args.out_dir, args.files, args.seed, args.max_chars)
    print(
        f"{s.files} files, {s.mb:.1f} MB ({s.bytes / s.files / 1000:.1f} KB mean, largest "
        f"{s.largest / 1000:.0f} KB, {s.over_50k} over 50 KB, vocabulary {len(FUNCTION_WORDS) + len(CONTENT_WORDS)} "
        f"words) in {s.root} ({s.seconds:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
