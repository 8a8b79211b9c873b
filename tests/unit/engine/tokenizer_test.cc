#include "engine/tokenizer.h"

#include <filesystem>
#include <random>

#include "engine/model_path.h"
#include "engine/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

using ::testing::ElementsAre;

TEST(UnicodeTest, CategoriesOfSampleCodepoints) {
  EXPECT_TRUE(IsLetter('a'));
  EXPECT_TRUE(IsLetter(0xE9));    // é
  EXPECT_TRUE(IsLetter(0x4E2D));  // 中
  EXPECT_TRUE(IsLetter(0x05D0));  // Hebrew alef
  EXPECT_FALSE(IsLetter('1'));
  EXPECT_FALSE(IsLetter(0x1F600));  // emoji
  EXPECT_TRUE(IsNumber('7'));
  EXPECT_TRUE(IsNumber(0x0663));  // Arabic-Indic three
  EXPECT_TRUE(IsNumber(0x00BD));  // ½ (No)
  EXPECT_TRUE(IsNumber(0x2163));  // Roman numeral four (Nl)
  EXPECT_FALSE(IsNumber('x'));
  EXPECT_TRUE(IsWhitespace(' '));
  EXPECT_TRUE(IsWhitespace('\n'));
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_FALSE(IsWhitespace(0x200B));  // zero-width space is not White_Space
}

TEST(UnicodeTest, DecodeTilesInputEvenWhenMalformed) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 20, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    size_t next = 0;
    for (const Utf8Char& c : DecodeUtf8(s)) {
      ASSERT_EQ(c.byte_begin, next);
      next += c.byte_len;
    }
    ASSERT_EQ(next, s.size());
  }
  auto cs = DecodeUtf8("a\xC3\xA9\xF0\x9F\x98\x80\xC0\xAF");
  ASSERT_EQ(cs.size(), 5u);
  EXPECT_EQ(cs[1].cp, 0xE9u);
  EXPECT_EQ(cs[2].cp, 0x1F600u);
  EXPECT_EQ(cs[3].cp, kInvalidCodepoint);  // overlong encoding
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string path = DefaultModelPath();
    if (!std::filesystem::exists(path)) return;
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = f->release();
    auto t = Tokenizer::FromGguf(*file_);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << MissingModelHint(DefaultModelPath());
  }
  static GgufFile* file_;
  static Tokenizer* tok_;
};
GgufFile* TokenizerTest::file_ = nullptr;
Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, ReadsVocabularyAndSpecialIds) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));
  EXPECT_TRUE(tok_->IsControl(1));
  EXPECT_EQ(tok_->TokenId("<|im_start|>"), 1);
}

TEST_F(TokenizerTest, PreTokenizerSplitsDigitsContractionsAndSpaces) {
  EXPECT_THAT(tok_->PreTokenize("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(tok_->PreTokenize("x 2024!"), ElementsAre("x", " ", "2", "0", "2", "4", "!"));
  EXPECT_THAT(tok_->PreTokenize("it's they're"), ElementsAre("it", "'s", " they", "'re"));
  EXPECT_THAT(tok_->PreTokenize("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(tok_->PreTokenize("a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(tok_->PreTokenize("end  "), ElementsAre("end", "  "));
  EXPECT_THAT(tok_->PreTokenize(" ...?!"), ElementsAre(" ...?!"));
  EXPECT_THAT(tok_->PreTokenize("héllo 世界"), ElementsAre("héllo", " 世界"));
}

TEST_F(TokenizerTest, SpecialTokensAreSingleTokensOnlyWhenParsed) {
  auto ids = tok_->Encode("<|im_start|>user\nHi<|im_end|>\n");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
  auto raw = tok_->Encode("<|im_start|>", /*parse_special=*/false);
  EXPECT_GT(raw.size(), 1u);
  EXPECT_EQ(tok_->Decode(raw), "<|im_start|>");
}

TEST_F(TokenizerTest, AwkwardTextRoundTrips) {
  const char* texts[] = {
      "",
      "Hello, world!",
      "  leading and trailing   ",
      "tabs\tand\nnewlines\r\n\n\n",
      "digits 1234567890 and 3.14159, 1e-9, -42",
      "unicode: héllo wörld, ελληνικά, русский, 中文字符, العربية, עברית",
      "emoji 😀👍🏽👨‍👩‍👧 and flags 🇫🇷",
      "code: for (int i = 0; i < n; ++i) { x[i] += 1; }",
      "mixed'quotes' \"double\" `tick` it's I'm we'll you've they'd",
      "\xe2\x80\x8bzero\xe2\x80\x8bwidth and\u00a0nbsp",
      "<|im_end|> inside text <|im_start|>",
  };
  for (const char* t : texts) {
    std::vector<int32_t> ids = tok_->Encode(t);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->vocab_size());
    EXPECT_EQ(tok_->Decode(ids), t) << t;
  }
}

// Bytes whose byte-level symbol is in the vocabulary round-trip in any order; the others
// (e.g. 0xC0, 0xF5..0xFF, some C0 controls) have no token and are dropped, as in llama.cpp.
TEST_F(TokenizerTest, RandomBytesRoundTrip) {
  std::vector<char> representable;
  int dropped = 0;
  for (int b = 0; b < 256; ++b) {
    std::string one(1, static_cast<char>(b));
    if (tok_->Encode(one, false).empty()) {
      ++dropped;
    } else {
      ASSERT_EQ(tok_->Decode(tok_->Encode(one, false)), one);
      representable.push_back(static_cast<char>(b));
    }
  }
  EXPECT_LT(dropped, 40);
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) {
      c = rng() % 3 == 0 ? representable[rng() % representable.size()]
                         : "a 1\n.\xc3\xa9"[rng() % 7];
    }
    EXPECT_EQ(tok_->Decode(tok_->Encode(s, false)), s);
  }
}

TEST_F(TokenizerTest, CommonWordsAreSingleTokens) {
  EXPECT_EQ(tok_->Encode(" the").size(), 1u);
  EXPECT_EQ(tok_->Encode("Hello").size(), 1u);
  EXPECT_EQ(tok_->Encode("12").size(), 2u);  // digits never merge
}

TEST_F(TokenizerTest, GgufChatTemplateIsTheChatMlWeImplement) {
  auto tmpl = file_->GetString("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_NE(tmpl->find("You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
            std::string::npos);
  EXPECT_NE(tmpl->find("'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                       "'<|im_end|>' + '\n'"),
            std::string::npos);
  EXPECT_NE(tmpl->find("'<|im_start|>assistant\n'"), std::string::npos);
}

TEST(ChatTemplateTest, AddsDefaultSystemPromptAndGenerationPrompt) {
  std::vector<ChatMessage> m = {{"user", "Hi"}};
  EXPECT_EQ(ApplyChatTemplate(m, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  std::vector<ChatMessage> s = {{"system", "Be brief."}, {"user", "Q"}, {"assistant", "A"}};
  EXPECT_EQ(ApplyChatTemplate(s, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(ApplyChatTemplate({}, false), "");
}

}  // namespace
}  // namespace kvtier::engine
