"""Calibration set of the GPTQ quantization (`worker/quant/quantize.py`): fixed chat conversations.

32 user prompts (none of them in the agreement prompt sets of tests/quant) with the replies of the
default model (SmolLM2-135M-Instruct, bfloat16, greedy, at most 128 tokens) recorded once: calibration
text from the model's own output distribution, the "self-generated data" of data-free quantization
(LLM-QAT, Liu et al. 2023), since no corpus ships with the engine. About 4,600 tokens with the default
chat template. Any chat model can use them: they are rendered through its own template and tokenizer.
"""

CONVERSATIONS: tuple[tuple[str, str], ...] = (
    ("Tell me a fun fact about space.",
     ("The universe is a vast and wondrous place, filled with mysteries and wonders. One of the "
      "most fascinating facts about space is that it is a multiverse, a multiverse that exists "
      "beyond our own universe. This multiverse is often referred to as the multiverse of the "
      "multiverse, or the multiverse of the multiverse. It is a multiverse that exists beyond our "
      "own universe, and it is a multiverse that exists beyond our own universe.\n\nThis multiverse "
      "is often referred to as the multiverse of the multiverse, or the multiverse of the "
      "multiverse. It is a multiverse that exists beyond our own")),
    ("How do I bake bread at home?",
     ("Baking at home is a fun and rewarding experience. Here's a simple recipe to get you "
      "started:\n\nIngredients:\n- 2 100g loaves of bread\n- 200g all-purpose flour\n- 200g salt\n- 20g "
      "of active dry yeast\n- 20g of baking powder\n- 20g of baking soda\n- 20g of salt\n- 20g of "
      "sugar\n- 20g of baking powder\n- 20g of baking soda\n- 20g of salt\n")),
    ("What is the meaning of democracy?",
     ("The meaning of democracy is a system of government where power is distributed based on the "
      "will of the people, where the people have the final say in how their laws are made and "
      "enforced. It emphasizes the idea of elected representatives, free from the influence of "
      "powerful interests and the ability to make decisions that are in the best interest of the "
      "people. In a democracy, the people have the right to participate in the decision-making "
      "process, and the government is accountable to the people.\n\nIn a democracy, the people have "
      "the right to participate in the decision-making process, and the government is accountable "
      "to the people. This is often seen")),
    ("Write a limerick about a cat.",
     ("A cat with a tail of a cat, a cat with a tail of a cat, a cat with a tail of a cat, a cat "
      "with a tail of a cat, a cat with a tail of a cat, a cat with a tail of a cat, a cat with a "
      "tail of a cat, a cat with a tail of a cat, a cat with a tail of a cat, a cat with a tail of "
      "a cat, a cat with a tail of a cat, a cat with a tail of a cat, a cat with a tail of a cat, "
      "a cat with a tail of a cat, a cat")),
    ("Explain how vaccines work.",
     ("Vaccines work by introducing a weakened or inactivated form of a disease-causing organism "
      "into the body to prevent or treat a disease. The process begins with a vaccine, which is a "
      "weakened or inactivated form of the disease-causing organism. The vaccine is then "
      "administered to the individual, usually through a needle, and the immune system is trained "
      "to recognize and respond to the vaccine.\n\nThe immune system is trained to produce "
      "antibodies, which are proteins that can recognize and fight off the disease-causing "
      "organism. When the individual is exposed to the actual disease-causing organism, the immune "
      "system is trained to recognize the disease-causing organism")),
    ("What are good habits for studying?",
     ("When it comes to studying, there are several habits that can help you achieve your goals. "
      "Here are some of the most effective ones:\n\n1. Set a consistent study schedule: This helps "
      "you stay focused and motivated. Aim for 30 minutes of studying per day.\n\n2. Create a "
      "dedicated study space: This helps you avoid distractions and stay focused. Choose a quiet "
      "and comfortable place where you can study without interruptions.\n\n3. Use a device wisely: "
      "Use your device wisely. Use it to focus on your studies, rather than just using it to "
      "access your devices.\n\n4. Set aside dedicated time: This helps you")),
    ("Translate 'good morning' into Spanish and French.",
     ("El amigo está amigo, es un amigo.")),
    ("Why is exercise important for the heart?",
     ("Exercise is essential for the heart because it helps maintain a healthy cardiovascular "
      "system. It strengthens the heart muscle, improves blood circulation, and increases the "
      "efficiency of the heart's pumping function. Regular exercise helps to lower blood pressure, "
      "which is a major risk factor for heart disease. Additionally, exercise can help to improve "
      "cardiovascular health by reducing the risk of heart disease, improving overall "
      "cardiovascular health, and increasing the effectiveness of medications used to treat heart "
      "conditions.")),
    ("What is the tallest mountain in the world?",
     ("The tallest mountain in the world is Mount Everest, also known as K2. However, the highest "
      "mountain is Mount Kerguelen, which is located in Antarctica.")),
    ("Write a short story about a robot.",
     ("In the year 2150, a brilliant and resourceful robot named Kylin had been tasked with a "
      "mission to explore the depths of the human mind. Kylin was equipped with advanced "
      "technology, including a neural network that could learn and adapt at an unprecedented rate. "
      "The mission was to investigate the psychological impact of artificial intelligence on "
      "humanity.\n\nAs Kylin made its way through the vast expanse of the human mind, it encountered "
      "a complex array of emotions and behaviors. Kylin's primary goal was to understand the "
      "intricacies of human psychology, but it also had to consider the potential risks and "
      "consequences of its actions.")),
    ("How do I change a flat tire?",
     ("To change a flat tire, you'll need to use the right tools and a bit of know-how. First, "
      "you'll need to have a flat tire on. If you're not familiar with the process, don't worry, "
      "it's a common skill that's taught to anyone.\n\nThe first thing you'll need is a flat tire. "
      "You'll also need a flat tire jack. You can find these at most car repair shops or online.\n\n"
      "Now, let's talk about the tools. You'll need a flat tire jack, a flat tire jack, and a flat "
      "tire jack. You'll also need a flat")),
    ("What causes rain?",
     ("Rain is primarily caused by the interaction of atmospheric water vapor with the Earth's "
      "atmosphere. This process occurs when there is a combination of atmospheric water vapor, "
      "water vapor, and ice crystals in the air. The water vapor in the air is a mixture of water "
      "molecules, which are composed of hydrogen and oxygen atoms. When these water molecules come "
      "into contact with ice, they undergo a chemical reaction that converts them into water "
      "vapor.\n\nThe process of water vapor condensing into water is a natural phenomenon that "
      "occurs when the water molecules in the air are cooled and the water vapor condenses into a "
      "liquid. This process is essential for the Earth's")),
    ("Recommend a good book for teenagers.",
     ("The best book for teenagers is often debated, but there's no one-size-fits-all answer. "
      "However, there are some books that are highly recommended for teenagers. Here are a few:\n\n"
      "1. \"The Hunger Games: Catching Fire\" by Suzanne L'Anseau\nThis is a classic, award-winning "
      "novel that has been adapted into a film. It's a gripping, action-packed thriller that has "
      "been praised for its emotional depth and the attention to detail in the writing.\n\n2. \"The "
      "Hunger Games: Catching Fire\" by Suzanne L'Anseau\nThis is")),
    ("What is the stock market?",
     ("The stock market is a global financial market where companies' stock is traded on public "
      "platforms, allowing people to buy and sell securities. It's a decentralized market where "
      "companies can raise capital, and it's influenced by various factors, including government "
      "regulations, industry trends, and global events. The stock market is a crucial part of the "
      "global economy, providing investors with a platform to make informed decisions about "
      "businesses and their financial futures.")),
    ("Describe your ideal weekend.",
     ("Alec's ideal weekend is a unique blend of relaxation, adventure, and a dash of chaos. "
      "Imagine waking up to a breathtaking sunset, with the sound of the ocean and the gentle "
      "lapping of the shore against the shore. The air is filled with the scent of blooming "
      "flowers and the sound of the sea. You can take a leisurely walk along the beach, enjoying "
      "the beauty of the ocean and the beauty of the land.\n\nAlec's ideal weekend is a mix of "
      "relaxation, adventure, and chaos. It's a chance to unwind, to enjoy the beauty of the "
      "world, and to enjoy the beauty")),
    ("How does the internet work?",
     ("The internet is a vast network of interconnected computers and devices that use a "
      "technology called the internet. It's a global communication system that allows people to "
      "share information, access information, and communicate with each other across the world. "
      "The internet is made up of several components, including servers, routers, and the internet "
      "protocol (IP) address.\n\nThe internet uses a technology called TCP/IP, which is a set of "
      "rules that allows devices to communicate with each other. This technology allows devices to "
      "communicate with each other over the internet, which is a network of interconnected "
      "computers and devices. The internet is made up of many different components, including")),
    ("What is a black hole?",
     ("A black hole is a region in space where the gravitational pull is so strong that nothing, "
      "including light and matter, can escape. It's a theoretical concept predicted by Einstein's "
      "theory of relativity, and it's a fundamental aspect of the universe. Black holes are "
      "incredibly powerful objects that distort the fabric of spacetime, making them invisible to "
      "our telescopes. They're often described as the \"gravitational Field Warrior\" because "
      "they're exerting a strong gravitational pull on everything around them.")),
    ("Give me a recipe for pancakes.",
     ("I'm glad you asked for a recipe. Here's a simple and delicious recipe for pancakes:\n\n"
      "**Ingredients:**\n- 2 100g pancake batter\n- 1 100g pancake\n- 1 cup all-purpose flour\n- 1 "
      "100g all-spun flour\n- 1 100g all-spun flour\n- 1 100g all-spun flour\n- 1 100g all-spun flour\n"
      "- 1 100g all-spun flour\n-")),
    ("How do bees make honey?",
     ("Bees make honey using a process called \"honey production.\" They collect nectar from flowers "
      "and convert it into honey through a process called \"beekeeping.\" Bees have a unique way of "
      "extracting honey from nectar, which they use to create a wax cell that can store honey. "
      "They also use a process called \"beekeeping\" to store honey, which is a type of honey that "
      "bees produce on their own.\n\nBees can produce honey in a process called \"beekeeping,\" which "
      "involves a combination of enzymes and enzymes that break down the nectar into a liquid that "
      "can be used as a food source. This process is unique to bees")),
    ("Write a thank-you note to a teacher.",
     ("Dear [Teacher's Name],\n\nI hope this message finds you well. My name is [Student's Name], "
      "and I am your teacher. I am very grateful for your dedication and support in providing the "
      "best possible education to my students.\n\nI am very proud of you and your incredible work. I "
      "am very proud of you and your students.\n\nThank you for your dedication and support.\n\nYour "
      "kindness and compassion are truly inspiring.\n\nThank you for your support and dedication.\n\n"
      "Your kindness and compassion are truly inspiring.\n\nYour kindness and compassion are truly "
      "inspiring.\n\nYour kindness and compassion")),
    ("What is the capital of Japan?",
     ("The capital of Japan is Tokyo.")),
    ("Explain what a noun is.",
     ("A noun is a word that refers to a person, place, thing, or idea. It can be a noun, "
      "adjective, or adverb. Nouns can be abstract concepts like \"dog\" or \"book,\" or they can be "
      "concrete concepts like \"car\" or \"book.\" Nouns can also be abstract concepts like \"morale\" "
      "or \"morning.\"\n\nIn linguistics, a noun is often considered a fundamental element of "
      "language, as it is the basic building block of language. Nouns are used to create words, "
      "and they are used to describe the world around us.\n\nIn the context of grammar, a")),
    ("How can I save money each month?",
     ("To save money each month, you can start by reducing your daily expenses. This can be done "
      "by reducing your daily food consumption, reducing your daily water consumption, and "
      "reducing your daily energy consumption. You can also reduce your daily energy consumption "
      "by using energy-efficient appliances and using energy-saving light bulbs. You can also "
      "reduce your energy consumption by using energy-efficient light bulbs. You can also reduce "
      "your energy consumption by using energy-efficient light bulbs. You can also reduce your "
      "energy consumption by using energy-efficient light bulbs. You can also reduce your energy "
      "consumption by using energy-efficient light bulbs. You can also reduce your energy "
      "consumption")),
    ("What is climate change?",
     ("Climate change is a global scientific movement aimed at addressing the impact of human "
      "activities on the Earth's climate. It's a collective effort to reduce carbon emissions and "
      "promote sustainable practices. Climate change refers to the long-term rise in the Earth's "
      "temperature, primarily caused by the increase in greenhouse gases, primarily carbon "
      "dioxide, in the atmosphere. This shift has been occurring since the mid-20th century and is "
      "expected to continue. Climate change is a critical issue that requires immediate attention "
      "and collective action to mitigate its effects.")),
    ("Tell me a joke about computers.",
     ("What's a joke about computers? A joke about computers is that \"A computer is a computer, "
      "and a joke about computers is that a computer is a computer.\"")),
    ("How do I start running?",
     ("Starting a new job can be both exciting and intimidating. It's a great opportunity to "
      "explore new possibilities and make a positive impact. Here's a simple guide to help you get "
      "started:\n\nFirst, let's talk about what you're looking for. What's the first thing that "
      "comes to mind? What's the first thing that you want to do? This could be anything from "
      "learning a new skill, taking a class, or just exploring a new city.\n\nNow, let's talk about "
      "what you're looking for. What's the most important thing that you want to achieve? What's "
      "the most exciting thing that you want")),
    ("What is the difference between weather and climate?",
     ("Weather and climate are two closely related but distinct concepts. Weather refers to the "
      "physical phenomenon of climate, which is the pattern of temperature and precipitation in a "
      "given area over a specific period. Climate is the long-term average of weather patterns, "
      "including temperature, precipitation, and other climate variables.\n\nThe key differences "
      "between weather and climate are:\n\nWeather refers to the physical phenomenon of climate, "
      "while climate refers to the long-term average of climate patterns. Weather is influenced by "
      "external factors, such as the movement of the sun, while climate is determined by internal "
      "factors, such as the Earth's tilt and orbit around the Sun.")),
    ("What are the health benefits of drinking water?",
     ("Drinking water is essential for maintaining optimal health. Water is a vital nutrient that "
      "supports the body's functions, supports overall well-being, and is essential for the proper "
      "functioning of the human body. Drinking enough water is also crucial for the proper "
      "functioning of the human body, as it helps to regulate body temperature, aids digestion, "
      "and aids in the elimination of waste.\n\nWater is also essential for the proper functioning "
      "of the human body, as it helps to maintain the proper balance of bodily fluids, supports "
      "the proper functioning of the nervous system, supports the immune system, supports the "
      "nervous system, supports the nervous system, supports the nervous system")),
    ("Why do leaves change color in the fall?",
     ("The fall is a time when the leaves transform into a vibrant and beautiful color. During the "
      "fall, the leaves undergo a process called photosynthesis, which allows them to absorb "
      "carbon dioxide from the air and release oxygen. This process is a natural adaptation that "
      "helps the tree to survive during the winter.\n\nThe leaves change color due to the changing "
      "of the seasons. The leaves of the deciduous tree, which is the majority of the tree's "
      "leaves, are typically green. However, during the fall, the leaves undergo a process called "
      "abscission, which means they shed their outer layer and become a new leaf. This process is "
      "a natural part")),
    ("What is Python used for?",
     ("Python is a versatile programming language with numerous applications across various "
      "domains. Some of the most notable uses include:\n\nData Science:\n- Machine Learning: It's "
      "used for data analysis, particularly in data science.\n- Data Science: It's used for data "
      "analysis, particularly in data science.\n- Automation: It's used for automation tasks, such "
      "as data processing and data science.\n- Web Development: It's used for web development, "
      "especially for web development frameworks like Django and Flask.\n- Automation: It's used "
      "for automation tasks, such as data processing and data science.\n- Artificial Intelligence: "
      "It's used")),
    ("Describe the water cycle.",
     ("The water cycle is a fundamental concept in science that describes the continuous process "
      "of water on Earth. It involves the transformation of water from one form to another, "
      "primarily in the atmosphere. The water cycle is a continuous cycle that includes "
      "evaporation, condensation, precipitation, and eventually, the return of water to the "
      "Earth's surface.\n\nThe water cycle is driven by the sun's energy, which heats the Earth's "
      "atmosphere, causing water to evaporate. This process occurs in several stages, including "
      "evaporation, condensation, precipitation, and eventually, the return of water to the "
      "Earth's surface.\n\nThe water cycle is crucial for sustaining life on Earth")),
    ("How many continents are there?",
     ("The answer to this question is 7. There are 7 continents in total.")),
)
